"""Constraints declared beside each setting, and the one validator that reads them.

Exact semantics:

- A setting is a dataclass field made with :func:`setting`: its default, its constraints (checked
  in the order given), whether it is a list, whether it may be null, whether it is a run-time
  setting and its description (what it means to a user: the generated configuration reference,
  ``hetmm_ray/config_reference.py``, prints it). Nothing else states a setting's range or choices.
- :func:`validate` (run by :class:`Settings.__post_init__`) checks every setting of an object in
  declaration order and raises :class:`ConfigError` naming ``<prefix><field>``, then runs the
  class's cross-field rules (:meth:`Settings._check`). A list setting accepts any list or tuple,
  is stored as a tuple and has its :class:`Range` and :class:`Odd` constraints checked element by
  element; any other value is refused. A null value is accepted exactly where the setting is
  nullable (by default: where its default is None) and then nothing else is checked.
- :class:`Range` is a closed range of finite numbers: no NaN, no Infinity (JSON parsers accept
  both and they would break verdicts and JSON responses), never a boolean; an ``int`` range
  refuses non-integers. ``also`` names literal alternatives (``templates.sheets``: ``"auto"``).
- :func:`build` makes a settings object from a plain mapping (JSON/YAML): unknown keys are refused
  with the closest known name, nested settings classes are built from nested mappings.

This module imports nothing from the project but :mod:`hetmm_ray.errors`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from typing import Any, ClassVar, Self

from ..errors import HetmmError

__all__ = [
    "Check",
    "ConfigError",
    "OneOf",
    "Odd",
    "Range",
    "Settings",
    "Spec",
    "build",
    "did_you_mean",
    "is_finite_number",
    "is_run_time",
    "ranges_of",
    "setting",
    "spec_of",
    "validate",
]


class ConfigError(HetmmError, ValueError):
    """A configuration value is missing, unknown or out of range."""


def is_finite_number(value: Any) -> bool:
    """A real number that is not a boolean, NaN or infinite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def did_you_mean(value: Any, choices: tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or the empty string."""
    hint = difflib.get_close_matches(str(value), choices, n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


# --- constraints ---------------------------------------------------------------
@dataclass(frozen=True)
class Range:
    """A closed range ``[lo, hi]`` of finite numbers; ``kind=int`` refuses non-integers."""

    lo: float
    hi: float
    kind: type = float
    also: tuple[str, ...] = ()  # literal values accepted besides the numbers
    per_element: ClassVar[bool] = True

    def __call__(self, key: str, value: Any, *, nullable: bool = False) -> None:
        if value in self.also and isinstance(value, str):
            return
        integral = self.kind is not int or isinstance(value, int)
        if not (is_finite_number(value) and integral and self.lo <= value <= self.hi):
            what = "an integer" if self.kind is int else "a finite number"
            alternatives = "".join(f" or {a!r}" for a in self.also) + (" or null" if nullable else "")
            raise ConfigError(f"{key}: must be {what} in [{self.lo:g}, {self.hi:g}]{alternatives}, got {value!r}")


@dataclass(frozen=True)
class OneOf:
    """One of a fixed list of names; ``noun`` says what they are in the message."""

    choices: tuple[str, ...]
    noun: str
    per_element: ClassVar[bool] = False

    def __call__(self, key: str, value: Any, *, nullable: bool = False) -> None:
        if not (isinstance(value, str) and value in self.choices):
            raise ConfigError(
                f"{key}: unknown {self.noun} {value!r}; choose one of {', '.join(self.choices)}"
                + did_you_mean(value, self.choices)
            )


@dataclass(frozen=True)
class Odd:
    """An odd integer >= 1 (an ATMM window)."""

    per_element: ClassVar[bool] = True

    def __call__(self, key: str, value: Any, *, nullable: bool = False) -> None:
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1 and value % 2 == 1):
            raise ConfigError(f"{key}: every window must be an odd integer >= 1, got {value!r}")


@dataclass(frozen=True)
class Check:
    """Any other rule on the whole value: ``ok(value)``, else ``<key>: <text>, got <value>``."""

    ok: Callable[[Any], bool]
    text: str
    per_element: ClassVar[bool] = False

    def __call__(self, key: str, value: Any, *, nullable: bool = False) -> None:
        if not self.ok(value):
            raise ConfigError(f"{key}: {self.text}, got {value!r}")


Constraint = Range | OneOf | Odd | Check


# --- settings ------------------------------------------------------------------
_SPEC = "hetmm_ray.config"  # the key of a field's Spec in its metadata


@dataclass(frozen=True)
class Spec:
    """What :func:`setting` declared about one field."""

    checks: tuple[Constraint, ...] = ()
    many: bool = False  # a list: stored as a tuple, Range/Odd checked element by element
    nullable: bool = False
    run_time: bool = False  # a setting of this run, never stored with a product
    description: str = ""  # what the setting means to a user (the configuration reference prints it)


def setting(
    default: Any = MISSING,
    *checks: Constraint,
    factory: Any = MISSING,
    many: bool = False,
    nullable: bool | None = None,
    run_time: bool = False,
    description: str = "",
) -> Any:
    """A dataclass field with its constraints and its meaning beside it (``nullable`` defaults to
    ``default is None``; ``description``: one or two sentences for the configuration reference)."""
    spec = Spec(checks, many, default is None if nullable is None else nullable, run_time, description)
    return field(default=default, default_factory=factory, metadata={_SPEC: spec})


def spec_of(f: dataclasses.Field[Any]) -> Spec:
    """What was declared about ``f`` (nothing, for a plain field)."""
    return f.metadata.get(_SPEC) or Spec()


def is_run_time(f: dataclasses.Field[Any]) -> bool:
    """Whether ``f`` was declared a run-time setting (``setting(..., run_time=True)``)."""
    return spec_of(f).run_time


def validate(obj: Any, prefix: str) -> None:
    """Check every setting of ``obj`` against its declared constraints (see the module docstring)."""
    for f in dataclasses.fields(obj):
        spec = spec_of(f)
        key = prefix + f.name
        value = getattr(obj, f.name)
        if value is None and spec.nullable:
            continue
        if spec.many:
            if not isinstance(value, list | tuple):
                raise ConfigError(f"{key}: must be a list, got {value!r}")
            if type(value) is not tuple:
                value = tuple(value)
                object.__setattr__(obj, f.name, value)
        for check in spec.checks:
            for v in value if spec.many and check.per_element else (value,):
                check(key, v, nullable=spec.nullable)


def ranges_of(cls: type, prefix: str) -> dict[str, Range]:
    """The declared :class:`Range` of each numeric setting of ``cls``, by its dotted name."""
    out: dict[str, Range] = {}
    for f in dataclasses.fields(cls):
        for check in spec_of(f).checks:
            if isinstance(check, Range):
                out[prefix + f.name] = check
    return out


class Settings:
    """Base of the settings dataclasses: validated on construction, built from plain mappings.

    ``_prefix`` names the settings in messages (``backbone.``, ``service.``, ...);
    ``_mapping_prefix`` names unknown keys of a mapping given to :meth:`from_dict`.
    """

    _prefix: ClassVar[str] = ""
    _mapping_prefix: ClassVar[str | None] = None  # None: the same as _prefix

    def __post_init__(self) -> None:
        validate(self, self._prefix)
        self._check()

    def _check(self) -> None:
        """Rules across several settings (run after every setting passed its own constraints)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        return build(cls, data, cls._prefix if cls._mapping_prefix is None else cls._mapping_prefix)


def build(cls: type, data: Any, prefix: str) -> Any:
    """``cls(**data)`` from a plain mapping: unknown keys refused, nested settings built from mappings."""
    where = prefix.rstrip(".") or "configuration"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in known:
            hint = difflib.get_close_matches(key, known, n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else f"; known: {', '.join(sorted(known))}"
            raise ConfigError(f"unknown setting {prefix + str(key)!r}{extra}")
        section = known[key].default_factory
        if isinstance(section, type) and issubclass(section, Settings):
            value = build(section, value, f"{prefix}{key}.")
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:  # wrong type deep inside a cross-field rule
        raise ConfigError(f"{where}: {exc}") from None
