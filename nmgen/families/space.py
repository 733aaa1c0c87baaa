"""A family's search space, declared once.

A ``SearchSpace`` is a list of ``Param``s (name and values) and a ``SpaceMapping`` that
turns a choice of values into the family's configuration and back. The tuner's Optuna
parameters, the enumeration the model ranks, random sampling (the tests), subspaces (the
exhaustive comparison) and replay all derive from it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import multiprocessing
import random
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Protocol, Self

from ..epilogue import Epilogue
from ..problem import Problem


class ConfigError(ValueError):
    """A configuration that breaks a rule; the message names the rule."""


def coerce_enums(config: Any, enums: dict[str, type[Enum]]) -> None:
    """Turn the named fields of a frozen dataclass from their values (as records and JSON
    hold them) into their enums, or raise ``ConfigError`` naming the allowed values."""
    for name, enum in enums.items():
        value = getattr(config, name)
        if isinstance(value, enum):
            continue
        try:
            object.__setattr__(config, name, enum(value))
        except ValueError:
            allowed = ", ".join(e.value for e in enum)
            raise ConfigError(f"{name}={value!r}: expected one of {allowed}") from None


def coerce_epilogue(config: Any) -> None:
    """Turn a frozen configuration's ``epilogue`` from its JSON tag (``"bias_silu"``, or
    none) into an ``Epilogue``, or raise ``ConfigError`` naming the tags."""
    try:
        object.__setattr__(config, "epilogue", Epilogue.parse(config.epilogue))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def epilogue_json(values: dict[str, Any], config: Any) -> dict[str, Any]:
    """``values`` (a configuration's ``asdict``) with its epilogue as its tag, left out
    where there is none: a configuration without one keeps the JSON it always had."""
    values.pop("epilogue", None)
    if config.epilogue:
        values["epilogue"] = config.epilogue.tag
    return values


_UNSET = object()


def _value(v: Any) -> Any:
    return v.value if isinstance(v, Enum) else v


class ConfigRecord:
    """The record side of a family's frozen configuration dataclass: its parameters as
    JSON values (enums by value, the epilogue by its tag, ``family`` added) and back,
    and ``replace``, which validates the result as construction does."""

    family: ClassVar[str]
    # Fields held as enums and as bools, made so from what records and JSON hold.
    enum_fields: ClassVar[dict[str, type[Enum]]] = {}
    flag_fields: ClassVar[tuple[str, ...]] = ()
    # Parameters added after kernels were first tuned, by their default: left out of the
    # record there, so that an older kernel's stored parameters, name, generated header and
    # source stay as they were (its tuned records carry over: ``nmgen.tune.carry``).
    later_parameters: ClassVar[dict[str, Any]] = {}

    def __post_init__(self) -> None:
        """Construction, from values or a record's: the enums, the flags and the epilogue
        from what records hold, then the family's rules (``check_rules``)."""
        coerce_enums(self, self.enum_fields)
        coerce_epilogue(self)
        for name in self.flag_fields:
            object.__setattr__(self, name, bool(getattr(self, name)))
        self.check_rules()

    def to_dict(self) -> dict[str, Any]:
        d = epilogue_json(dataclasses.asdict(self), self)  # type: ignore[call-overload]
        d = {k: v.value if isinstance(v, Enum) else v for k, v in d.items()
             if self.later_parameters.get(k, _UNSET) != _value(v)}
        d["family"] = self.family
        return d

    def check_rules(self) -> None:
        """Raise ``ConfigError`` naming the first of the family's rules (``_rules``: (text,
        holds) pairs) that this configuration breaks."""
        for rule, ok in self._rules():  # type: ignore[attr-defined]
            if not ok:
                raise ConfigError(f"{self.name}: violates rule '{rule}'")  # type: ignore[attr-defined]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Self:
        d = dict(d)
        family = d.pop("family", cls.family)
        if family != cls.family:
            raise ConfigError(f"a {family} configuration is not a {cls.family} one: {d}")
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        if unknown:
            raise ConfigError(f"unknown configuration keys: {sorted(unknown)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Self:
        return cls.from_dict(json.loads(text))

    def replace(self, **changes: Any) -> Self:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True)
class Param:
    """One tuned parameter: its name (as Optuna and the records see it) and its values.

    ``enumerated``: the values the enumeration takes (default: all); the others are
    reached by the search and the family's seed variants only. ``share``: for a
    parameter of values ``(False, True)``, the chance a random draw takes ``True``."""

    name: str
    choices: tuple
    enumerated: tuple | None = None
    share: float | None = None

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError(f"parameter {self.name}: no values")
        if self.enumerated is not None and not set(self.enumerated) <= set(self.choices):
            raise ValueError(f"parameter {self.name}: enumerated values outside its choices")


class SpaceMapping(Protocol):
    """What a family tells its space: the values a problem allows, configuration from
    values and back, and a cheap early rejection (enumerations run into the millions)."""

    def allowed(self, problem: Problem, param: str, choices: tuple) -> tuple:
        """The values of ``param`` that ``problem`` allows (e.g. by A layout or arch)."""

    def build(self, problem: Problem, values: dict[str, Any]) -> Any:
        """The configuration, or ``ConfigError`` where the values break a rule."""

    def values_of(self, config: Any) -> dict[str, Any]:
        """The parameter values that build ``config``."""

    def quick_reject(self, values: dict[str, Any]) -> bool:
        """``True`` where ``build`` would surely refuse the values."""


@dataclass(frozen=True)
class SearchSpace:
    """The parameters a family tunes; equal and hashed by family and values alone."""

    family: str
    params: tuple[Param, ...]
    mapping: SpaceMapping = field(compare=False, repr=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def choices(self, problem: Problem) -> dict[str, tuple]:
        """Each parameter's values for ``problem``: Optuna's categorical space."""
        return {p.name: self.mapping.allowed(problem, p.name, p.choices) for p in self.params}

    def config(self, problem: Problem, values: dict[str, Any]) -> Any | None:
        """The configuration of ``values``, or ``None`` where it breaks a rule."""
        try:
            return self.mapping.build(problem, values)
        except ConfigError:
            return None

    def values_of(self, config: Any) -> dict[str, Any]:
        return self.mapping.values_of(config)

    def contains(self, config: Any) -> bool:
        values = self.values_of(config)
        return all(values[p.name] in p.choices for p in self.params)

    def narrowed(self, **choices: tuple) -> SearchSpace:
        """The same space with fewer values for the named parameters."""
        unknown = set(choices) - set(self.names)
        if unknown:
            raise ValueError(f"{self.family} space has no parameter {sorted(unknown)}")
        params = []
        for p in self.params:
            values = tuple(choices.get(p.name, p.choices))
            enumerated = p.enumerated and tuple(v for v in p.enumerated if v in values)
            params.append(Param(p.name, values, enumerated or None, p.share))
        return SearchSpace(self.family, tuple(params), self.mapping)

    def columns(self, problem: Problem, enumerated: bool = True) -> list[tuple]:
        """Each parameter's values for ``problem``: the enumerated ones, or
        (``enumerated=False``) all the tuner may ask for."""
        return [tuple(v for v in self.mapping.allowed(problem, p.name, p.choices)
                      if not enumerated or p.enumerated is None or v in p.enumerated)
                for p in self.params]

    def grid(self, problem: Problem, enumerated: bool = True) -> Iterator[dict[str, Any]]:
        """Every combination of the values ``problem`` allows (``columns``)."""
        for combination in itertools.product(*self.columns(problem, enumerated)):
            yield dict(zip(self.names, combination, strict=True))

    def enumerate(self, problem: Problem) -> Iterator[Any]:
        """Every valid configuration of the enumerated values, in a fixed order; split
        over processes inside ``parallel_enumeration``."""
        columns = self.columns(problem)
        if _processes > 1 and math.prod(map(len, columns)) >= PARALLEL_FROM:
            yield from _enumerate_parallel(self, problem, columns, _processes)
        else:
            yield from self.enumerate_columns(problem, columns)

    def enumerate_columns(self, problem: Problem, columns: list[tuple]) -> Iterator[Any]:
        """The valid configurations of every combination of ``columns``, in order."""
        for combination in itertools.product(*columns):
            values = dict(zip(self.names, combination, strict=True))
            if not self.mapping.quick_reject(values):
                config = self.config(problem, values)
                if config is not None:
                    yield config

    def sample(self, problem: Problem, rng: random.Random, max_tries: int = 10000) -> Any:
        """A random valid configuration (each value drawn uniformly, ``share`` for the
        flags that have one; rejection sampling)."""
        choices = self.choices(problem)
        for _ in range(max_tries):
            values = {p.name: (rng.random() < p.share if p.share is not None
                               and set(choices[p.name]) == {False, True}
                               else rng.choice(choices[p.name])) for p in self.params}
            config = self.config(problem, values)
            if config is not None:
                return config
        raise ConfigError(f"no valid {self.family} configuration found for {problem}")


# Enumerations of at least this many combinations split over processes inside
# ``parallel_enumeration``: the FP32 family's row-major 8:32 space has 777,600 (6 s serial).
PARALLEL_FROM = 100_000
_processes = 1


@contextlib.contextmanager
def parallel_enumeration(processes: int) -> Iterator[None]:
    """Inside the block, large enumerations run in ``processes`` forked processes. For
    the start of ``nmgen tune`` (before any CUDA context or thread exists, which a fork
    must not copy); serial where the platform cannot fork."""
    global _processes
    before = _processes
    forks = "fork" in multiprocessing.get_all_start_methods()
    _processes = max(1, processes) if forks else 1
    try:
        yield
    finally:
        _processes = before


def _enumerate_parallel(space: SearchSpace, problem: Problem, columns: list[tuple],
                        processes: int) -> Iterator[Any]:
    """``space.enumerate_columns`` over contiguous runs of the leading columns'
    combinations, one run a task, concatenated in order (the serial order)."""
    lead = 1
    while lead < len(columns) and math.prod(map(len, columns[:lead])) < 4 * processes:
        lead += 1
    prefixes = list(itertools.product(*columns[:lead]))
    size = -(-len(prefixes) // (4 * processes))
    runs = [prefixes[i:i + size] for i in range(0, len(prefixes), size)]
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(processes, mp_context=context) as pool:
        for configs in pool.map(_enumerate_run, [(space, problem, r, columns[lead:])
                                                 for r in runs]):
            yield from configs


def _enumerate_run(job: tuple) -> list[Any]:
    space, problem, prefixes, rest = job
    return [config for prefix in prefixes
            for config in space.enumerate_columns(problem, [(v,) for v in prefix] + rest)]
