"""The scalar argument checks of fastqa._checks: what each accepts (and returns), what it refuses, with which
exception, and a message that names the argument and what was expected; and the scope in which a model's layers
skip the checks of arguments the model built (``arguments_checked``)."""
from __future__ import annotations

import math
import subprocess
import sys
import threading
from fractions import Fraction

import numpy as np
import pytest

from fastqa._checks import arguments_checked, check_bool, check_int, check_number, check_tensor, check_text
from fastqa.errors import UserError


# --- check_int ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, kwargs", [
    (0, {}), (-7, {}), (2 ** 70, {}), (1, dict(low=1)), (5, dict(low=1, high=5)), (-3, dict(high=-3)),
    (np.int64(4), dict(low=1)),
])
def test_check_int_accepts_and_returns_an_int(value, kwargs):
    got = check_int("n", value, **kwargs)
    assert got == value and type(got) is int


@pytest.mark.parametrize("value", [True, False, 2.0, 1.5, "3", None, np.float64(2.0), [1]])
def test_check_int_refuses_a_non_int_with_a_type_error(value):
    with pytest.raises(TypeError, match=rf"^n must be an int >= 1, got {type(value).__name__}$"):
        check_int("n", value, low=1)


@pytest.mark.parametrize("value, kwargs, expected", [
    (0, dict(low=1), "an int >= 1"),
    (-1, dict(low=0), "an int >= 0"),
    (6, dict(high=5), "an int <= 5"),
    (6, dict(low=1, high=5), r"an int in \[1, 5\]"),
    (0, dict(low=1, high=5), r"an int in \[1, 5\]"),
])
def test_check_int_refuses_a_value_out_of_range_with_a_value_error(value, kwargs, expected):
    with pytest.raises(ValueError, match=rf"^batch_size must be {expected}, got {value}$"):
        check_int("batch_size", value, **kwargs)


def test_check_int_without_bounds_names_the_type_only():
    with pytest.raises(TypeError, match=r"^Config\.layers must be an int, got str$"):
        check_int("Config.layers", "4")


def test_check_int_expected_and_error_replace_the_wording_and_the_exception():
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="^heads must be a positive int, got ") as info:
            check_int("heads", bad, low=1, expected="a positive int", error=ValueError)
        assert type(info.value) is ValueError
    with pytest.raises(UserError, match="^max_context must be an int >= 1, got 0$"):
        check_int("max_context", 0, low=1, error=UserError)
    with pytest.raises(UserError, match="^max_context must be an int >= 1, got str$"):
        check_int("max_context", "5", low=1, error=UserError)


# --- check_number ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, kwargs", [
    (0, {}), (-2.5, {}), (math.inf, {}), (0.0, dict(low=0)), (1, dict(low=0, high=1)), (0.5, dict(low=0, high=1)),
    (1e-12, dict(low=0, low_open=True)), (0.999, dict(low=0, high=1, high_open=True)), (np.float32(0.25), {}),
    (Fraction(1, 4), dict(low=0, high=1)), (1e300, dict(low=0, high=math.inf, high_open=True)),
])
def test_check_number_accepts_and_returns_a_float(value, kwargs):
    got = check_number("x", value, **kwargs)
    assert got == float(value) and type(got) is float


@pytest.mark.parametrize("value", [True, False, "0.5", None, 1j, [0.5]])
def test_check_number_refuses_a_non_number_with_a_type_error(value):
    with pytest.raises(TypeError, match=rf"^min_score must be a number in \[0, 1\], got {type(value).__name__}$"):
        check_number("min_score", value, low=0, high=1)


@pytest.mark.parametrize("value, kwargs, expected", [
    (math.nan, {}, "a number"),
    (math.nan, dict(low=0, high=1), r"a number in \[0, 1\]"),
    (-0.1, dict(low=0), "a number >= 0"),
    (0, dict(low=0, low_open=True), "a number > 0"),
    (1.5, dict(high=1), "a number <= 1"),
    (1, dict(high=1, high_open=True), "a number < 1"),
    (1, dict(low=0, high=1, high_open=True), r"a number in \[0, 1\)"),
    (0.0, dict(low=0, high=1, low_open=True), r"a number in \(0, 1\]"),
    (math.inf, dict(low=0, high=math.inf, low_open=True, high_open=True), r"a number in \(0, inf\)"),
])
def test_check_number_refuses_nan_and_a_value_out_of_range_with_a_value_error(value, kwargs, expected):
    with pytest.raises(ValueError, match=rf"^eps must be {expected}, got {float(value)}$"):
        check_number("eps", value, **kwargs)


def test_check_number_expected_and_error_replace_the_wording_and_the_exception():
    for bad in (True, 1.5, math.nan):
        with pytest.raises(ValueError, match=r"^p must be a float in \[0, 1\], got ") as info:
            check_number("p", bad, low=0, high=1, expected="a float in [0, 1]", error=ValueError)
        assert type(info.value) is ValueError


# --- check_bool -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [True, False])
def test_check_bool_accepts_a_bool(value):
    assert check_bool("lowercase", value) is value


@pytest.mark.parametrize("value", [0, 1, "yes", None, np.bool_(True)])
def test_check_bool_refuses_anything_else_with_a_type_error(value):
    with pytest.raises(TypeError, match=rf"^lowercase must be a bool, got {type(value).__name__}$"):
        check_bool("lowercase", value)


def test_importing_the_checks_loads_no_torch():
    # fastqa.serve.limits checks the serve command's defaults here while `fastqa --help` builds its parser.
    code = "import sys, fastqa._checks; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# --- check_text: the one text check (the Python API, ask's flags, question files, the server) ---------------------

def test_check_text_returns_text_and_names_what_is_wrong_where():
    assert check_text("the context", "Ada was born.", blank=True) == "Ada was born."
    assert check_text("sentence 1", "   ") == "   "  # blank text is refused only when asked (a blank sentence: "")
    lone = "caf\udce9 au lait"  # a byte that was not UTF-8, decoded leniently (PEP 383)
    with pytest.raises(UserError, match=r"^the context is not valid Unicode text \(a lone surrogate at character 3\)"
                                        r" \(pair 2\)$"):
        check_text("the context", lone, where=" (pair 2)")
    with pytest.raises(UserError, match=r"^q.jsonl: line 4: the question is empty$"):
        check_text("the question", " \n\t", at="q.jsonl: line 4: ", blank=True)
    with pytest.raises(UserError, match=r"^--context: not valid UTF-8 text \(an undecodable byte at character 3\); "
                                        r"pass UTF-8$"):
        check_text("the context", lone, at="--context: ", undecodable="pass UTF-8")


# --- arguments_checked -----------------------------------------------------------------------------------------

def test_arguments_checked_passes_values_through_on_its_own_thread_only():
    inside, other_thread = threading.Event(), []

    def check_elsewhere() -> None:
        inside.wait(5)
        try:
            check_tensor("x", "a string")
            other_thread.append("passed")
        except TypeError:
            other_thread.append("refused")

    worker = threading.Thread(target=check_elsewhere)
    worker.start()
    with arguments_checked():
        with arguments_checked():   # nested scopes
            assert check_tensor("x", "a string") == "a string"
        assert check_int("n", -1, low=0) == -1 and check_number("p", math.nan) is math.nan
        inside.set()
        worker.join(5)
    assert other_thread == ["refused"]
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        check_tensor("x", "a string")


def test_arguments_checked_ends_with_an_exception_raised_inside():
    with pytest.raises(RuntimeError, match="inside"):
        with arguments_checked():
            raise RuntimeError("inside")
    with pytest.raises(ValueError, match="n must be an int >= 0"):
        check_int("n", -1, low=0)
