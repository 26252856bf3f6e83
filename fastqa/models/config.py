"""The base of the models' config dataclasses: named presets, a JSON-able dict round trip, field checks."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence

from .._checks import check_bool, check_choice, check_int, check_number

__all__ = ["ModelConfig"]


class ModelConfig:
    """Base of the models' config dataclasses: named presets, a JSON-able dict round trip, field checks.

    A subclass is a ``@dataclass`` that sets ``PRESETS`` (name -> field values), ``REQUIRED`` (fields a preset
    cannot know, e.g. vocabulary sizes) and ``MODEL`` (the model's name in messages).
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}
    REQUIRED: ClassVar[tuple[str, ...]] = ()
    MODEL: ClassVar[str] = "model"

    @classmethod
    def from_preset(cls, name: str, **overrides: Any):
        """The preset ``name`` with ``overrides`` (at least the ``REQUIRED`` fields)."""
        if name not in cls.PRESETS:
            raise ValueError(f"unknown {cls.MODEL} preset {name!r}; known: {', '.join(cls.PRESETS)}")
        return cls.from_dict({**cls.PRESETS[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict; ``from_dict`` rebuilds the same config."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        """Inverse of ``to_dict``; unknown keys and missing ``REQUIRED`` fields raise ValueError naming them."""
        if not isinstance(d, dict):
            raise TypeError(f"{cls.__name__}.from_dict takes a dict, got {type(d).__name__}")
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})  # type: ignore[arg-type]
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
        missing = [k for k in cls.REQUIRED if k not in d]
        if missing:
            raise ValueError(f"{cls.__name__} needs {', '.join(missing)}")
        return cls(**d)

    # -- field checks for __post_init__ (fastqa._checks, the field named "Config.field")
    def _check_int(self, name: str, minimum: int) -> None:
        """An int >= minimum, stored as an int."""
        setattr(self, name, check_int(f"{type(self).__name__}.{name}", getattr(self, name), low=minimum))

    def _check_prob(self, name: str) -> None:
        """A probability in [0, 1), stored as a float."""
        setattr(self, name, check_number(f"{type(self).__name__}.{name}", getattr(self, name), low=0, high=1,
                                         high_open=True))

    def _check_choice(self, name: str, choices: Sequence[str]) -> None:
        check_choice(f"{type(self).__name__}.{name}", getattr(self, name), choices)

    def _check_bool(self, name: str) -> None:
        check_bool(f"{type(self).__name__}.{name}", getattr(self, name))


    def _check_special_ids(self, ids: Sequence[str], vocab_sizes: Sequence[str]) -> None:
        """The special token ids ``ids`` (ints >= 0, distinct: two ids "must differ", more "must be distinct")
        and the vocabulary sizes ``vocab_sizes``, each large enough to hold them all."""
        for name in ids:
            self._check_int(name, 0)
        values = {name: getattr(self, name) for name in ids}
        if len(set(values.values())) != len(values):
            model = type(self).__name__
            if len(ids) == 2:
                raise ValueError(f"{model}.{ids[0]} and {ids[1]} must differ, both are {values[ids[0]]}")
            raise ValueError(f"{model} special ids must be distinct, got {values}")
        for name in vocab_sizes:
            self._check_int(name, max(values.values()) + 1)
