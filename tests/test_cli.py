"""The ``fastqa`` command as a whole: its version, a help that starts without torch, and the flags every
subcommand shares (one vocabulary, one default, one-line errors)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from cli_helpers import assert_user_error, run_cli

import fastqa
from fastqa.cli import build_parser
from fastqa.tasks import TASKS, task_of

RUNNING = ["qa-train", "qa-predict", "qa-calibrate", "ask", "mt-train", "translate", "mt-eval"]


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(capsys, ["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"fastqa {fastqa.__version__}"


def test_help_does_not_import_torch():
    code = ("import sys; from fastqa.cli import build_parser; build_parser().format_help(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def _options(command: str) -> dict:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return {opt: action for action in sub.choices[command]._actions for opt in action.option_strings}


@pytest.mark.parametrize("command", RUNNING)
def test_every_running_subcommand_takes_device_and_threads_with_one_default(command):
    options = _options(command)
    assert options["--device"].default is None and options["--threads"].default is None


def test_train_commands_share_the_training_flags():
    shared = ["--set", "--clip", "--eval-every", "--layers", "--precision", "--max-steps", "--max-minutes",
              "--resume", "--out", "--seed", "--batch-size", "--log-every", "--no-progress"]
    qa, mt = _options("qa-train"), _options("mt-train")
    for flag in shared:
        assert flag in qa and flag in mt, flag
        assert qa[flag].dest == mt[flag].dest
    assert qa["--precision"].choices == mt["--precision"].choices == ("fp32", "bf16", "fp16")


@pytest.mark.parametrize("device,pattern", [("gpu", "'gpu' is not a device"),
                                            ("cuda:7", "CUDA" if not torch.cuda.is_available() else "only")])
def test_unusable_device_is_one_line(capsys, tmp_path, device, pattern):
    assert_user_error(capsys, ["ask", "--model", tmp_path, "--context", "a b", "--question", "a?", "--device", device],
                      pattern)


@pytest.mark.parametrize("command", ["qa-train", "mt-train"])
def test_run_folder_problems_are_reported_before_any_data_is_read(capsys, tmp_path, command):
    # The data files do not exist: an error about them would mean the run folder was checked too late.
    missing = str(tmp_path / "missing")
    data = (["--train", missing, "--dev", missing] if command == "qa-train"
            else ["--src", missing, "--tgt", missing, "--valid-src", missing, "--valid-tgt", missing])
    assert_user_error(capsys, [command, *data, "--out", tmp_path / "run", "--resume"], r"--resume: .*no such checkpoint")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"")
    assert_user_error(capsys, [command, *data, "--out", tmp_path / "run"], "exists: pass --resume")
    assert_user_error(capsys, [command, *data, "--out", tmp_path / "run" / "checkpoint.pt"], "is a file")


def test_cpu_precision_needs_native_bf16_and_fp16_a_gpu(capsys, tmp_path, monkeypatch):
    """bf16 on the CPU runs where the processor multiplies it natively and is one line and exit 2 elsewhere, for
    training and for the inference commands; fp16 on the CPU is always refused."""
    from fastqa import _backend

    missing = str(tmp_path / "missing.json")
    train = ["qa-train", "--train", missing, "--dev", missing, "--out", tmp_path / "run", "--device", "cpu"]
    assert_user_error(capsys, [*train, "--precision", "fp16"], "--precision fp16 needs a CUDA device")
    monkeypatch.setattr(_backend, "cpu_bf16_support", lambda: "none")
    assert_user_error(capsys, [*train, "--precision", "bf16"], "needs a processor that multiplies bfloat16 natively")
    assert_user_error(capsys, ["ask", "--precision", "bf16", "--device", "cpu", "--context", "A b.", "--question", "Who?"],
                      "precision='bf16' on the CPU needs a processor")
    monkeypatch.setattr(_backend, "cpu_bf16_support", lambda: "avx512_bf16")
    # With native bf16 the flags pass and the run gets as far as reading the (missing) data.
    assert_user_error(capsys, [*train, "--precision", "bf16"], "missing.json")


@pytest.mark.parametrize("command,extra,pattern", [
    ("qa-train", ["--preset", "nope"], "nope"),
    ("qa-train", ["--set", "no_such_field=3"], "no_such_field"),
    ("mt-train", ["--set", "no_such_field=3"], "no_such_field"),
])
def test_config_errors_come_before_any_data_is_read(capsys, tmp_path, command, extra, pattern):
    # Files that fail as soon as they are read: an error about them would mean the config was checked late.
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    short = tmp_path / "short.txt"
    short.write_text("one\ntwo\n")  # line counts differ from bad.json
    data = (["--train", bad, "--dev", bad] if command == "qa-train"
            else ["--src", bad, "--tgt", short, "--valid-src", bad, "--valid-tgt", short])
    assert_user_error(capsys, [command, *data, "--out", tmp_path / "run", *extra], pattern)


def test_a_wrong_vectors_file_is_reported_before_the_data_is_read(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")  # read first, this would be the error
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("the quick brown fox\n")
    assert_user_error(capsys, ["qa-train", "--train", bad, "--dev", bad, "--out", tmp_path / "run",
                               "--vectors", vectors], "vectors.txt: line 1")


def _parse_error(capsys, args) -> str:
    """The one line on stderr of a command line the parser refuses with status 2."""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([str(a) for a in args])
    assert e.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("args,wrong,right", [(["ask", "--contxt", "x"], "--contxt", "--context"),
                                              (["translate", "--n-best", "3"], "--n-best", "--nbest")])
def test_a_mistyped_flag_is_reported_by_its_subcommand_with_the_closest_one(capsys, args, wrong, right):
    # the subcommand's name and help, not the top one's
    assert _parse_error(capsys, args) == (f"fastqa {args[0]}: unrecognized argument {wrong} (did you mean {right}?); "
                                          f"see fastqa {args[0]} --help")


def _subcommands() -> dict:
    return next(a for a in build_parser()._actions if a.dest == "command").choices


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_every_subcommand_suggests_its_own_flag_for_a_typo(capsys, command):
    # Its longest flag with a letter dropped: reported before any missing required argument.
    flags = [o for a in _subcommands()[command]._actions for o in a.option_strings if o.startswith("--")]
    flag = max([o for o in flags if o != "--help"] or flags, key=len)
    typo = flag[:4] + flag[5:]
    assert _parse_error(capsys, [command, typo]) == (f"fastqa {command}: unrecognized argument {typo} (did you mean "
                                                     f"{flag}?); see fastqa {command} --help")


@pytest.mark.parametrize("args,error", [
    (["tranlsate"], "fastqa: unknown command 'tranlsate' (did you mean translate?); see fastqa --help"),
    (["--verison"], "fastqa: unrecognized argument --verison (did you mean --version?); see fastqa --help"),
    (["qa-train", "--precision", "fp31"], "fastqa qa-train: --precision: invalid choice: 'fp31' (did you mean "
                                          "'fp32'? choose from 'fp32', 'bf16', 'fp16'); see fastqa qa-train --help"),
    (["download", "sqaud"], "fastqa download: NAME: invalid choice: 'sqaud' (did you mean 'squad'? choose from "
                            "'squad', 'glove', 'multi30k'); see fastqa download --help"),
    (["export", "run", "out", "extra"], "fastqa export: unrecognized argument extra; see fastqa export --help"),
    (["ask", "--top-k", "2", "--xyzzy"], "fastqa ask: unrecognized argument --xyzzy; see fastqa ask --help"),
])
def test_other_mistakes_name_the_closest_right_spelling(capsys, args, error):
    assert _parse_error(capsys, args) == error


def test_abbreviations_negative_numbers_and_dashed_values_still_parse():
    args = build_parser().parse_args(["ask", "--context", "-", "--quest", "-5", "--top", "3"])
    assert (args.context, args.question, args.top_k) == ("-", "-5", 3)


def test_info_lists_the_shipped_models_with_their_cards_scores(capsys):
    import json

    from fastqa import pretrained

    rc, out, _ = run_cli(capsys, ["info"])
    models = json.loads(out)["shipped_models"]
    assert rc == 0 and set(models) == set(pretrained.NAMES)
    for name, model in models.items():
        assert model["installed"] == (name in pretrained.available())
        assert [t.shipped for t in TASKS if t.name == model["task"]] == [name]  # the task that ships it
        scores = model["scores"]
        # The cards' figures change with each export: that they parse as numbers is what is checked.
        assert scores == "see README.md" or (scores and all(isinstance(v, float) for v in scores.values())), scores


def test_shipped_scores_come_from_config_json_then_the_card_then_a_pointer(monkeypatch, tmp_path):
    import json

    from fastqa import pretrained

    names = {"from-config": "a", "from-card": "b", "no-figures": "c", "absent": "d"}
    monkeypatch.setattr(pretrained, "FOLDER", tmp_path)
    monkeypatch.setattr(pretrained, "NAMES", names)
    for sub, config in [("a", {"kind": "qanet", "scores": {"EM": 40, "F1": 52.5}, "evaluated_on": "dev 40-47"}),
                        ("b", {"kind": "convs2s"}), ("c", {"kind": "convs2s"})]:
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "config.json").write_text(json.dumps(config))
    (tmp_path / "a" / "README.md").write_text("## Evaluation\n**EM 1.00, F1 2.00**\n")  # config.json wins
    (tmp_path / "b" / "README.md").write_text("# b\n\n## Evaluation\ntest_2016_flickr, beam 5: **sacreBLEU 40.09** "
                                              "(signature x|y:1.0), **chrF\n59.86**; BLEU 40.53.\n\n## Limitations\n"
                                              "**BLEU 99.0** elsewhere\n")
    (tmp_path / "c" / "README.md").write_text("## Evaluation\nNot evaluated yet.\n")
    got = pretrained.shipped(task_of)  # no task ships these names: each one's task is the one reading its kind
    assert got["from-config"]["scores"] == {"EM": 40.0, "F1": 52.5}
    assert (got["from-config"]["task"], got["from-config"]["evaluated_on"]) == ("qa", "dev 40-47")
    assert got["from-card"]["scores"] == {"sacreBLEU": 40.09, "chrF": 59.86}
    assert (got["from-card"]["task"], got["from-card"]["evaluated_on"]) == ("translation", "test_2016_flickr, beam 5")
    assert got["no-figures"]["scores"] == "see README.md"
    assert got["absent"]["installed"] is False and got["absent"]["scores"] == "see README.md"
    assert [got[n]["installed"] for n in ("from-config", "from-card", "no-figures")] == [True] * 3
    assert got["from-card"]["path"] == str(tmp_path / "b") and got["absent"]["card"] is None
