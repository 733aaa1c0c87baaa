"""The kernel families nmgen knows: the built-in ones, those of installed packages (entry
point group ``nmgen.families``) and any registered at run time (``register``).

Everything above the families finds them here, by name, by configuration or by the
problem they serve; adding a family touches no tuner, store or dispatch code.
"""

from __future__ import annotations

import functools
from importlib.metadata import entry_points
from typing import Any

from ..problem import Problem
from .base import Config, Family
from .f32_simt import F32_SIMT
from .gemv import GEMV
from .mma import MMA
from .mmasp import MMASP
from .space import ConfigError
from .sptc import SPTC
from .wgmma import WGMMA

ENTRY_POINT_GROUP = "nmgen.families"
_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Make ``family`` known (under ``family.name``; a later one of that name replaces
    the earlier)."""
    _FAMILIES[family.name] = family
    _forget()
    return family


def unregister(name: str) -> None:
    _FAMILIES.pop(name, None)
    _forget()


def _forget() -> None:
    _families.cache_clear()
    _by_generator.cache_clear()


@functools.cache
def _families() -> tuple[Family, ...]:
    return tuple(_FAMILIES.values())


def all_families() -> tuple[Family, ...]:
    return _families()


def get(name: str) -> Family:
    try:
        return _FAMILIES[name]
    except KeyError:
        known = ", ".join(sorted(_FAMILIES))
        raise ConfigError(f"unknown kernel family {name!r}; known: {known}") from None


def family_of(config: Config) -> Family:
    return get(config.family)


@functools.cache
def _by_generator() -> dict[str, Family]:
    return {f.generator_hash(): f for f in _families()}


def by_generator(generator_hash: str) -> Family | None:
    """The family whose generator hash (``Family.generator_hash``) this is; ``None`` for
    records of a generator no longer current (``nmgen carry`` re-keys them)."""
    return _by_generator().get(generator_hash)


def serving(problem: Problem) -> list[Family]:
    """The families that can run ``problem``."""
    return [f for f in _families() if f.serves(problem) is None]


def config_from_dict(values: dict[str, Any]) -> Config:
    """A configuration from its JSON form, by the family it names."""
    if "family" not in values:
        raise ConfigError(f"configuration {values!r} names no family")
    return get(values["family"]).config_from_dict(values)


def config_from_name(name: str) -> Config:
    """The configuration a kernel name states, whichever family's it is."""
    for family in _families():
        config = family.config_from_name(name)
        if config is not None:
            return config
    raise ConfigError(f"{name!r} is not a kernel name of any family "
                      f"({', '.join(sorted(_FAMILIES))})")


def _load_plugins() -> None:
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        register(entry.load())


register(F32_SIMT)
register(GEMV)
register(MMA)
register(WGMMA)
register(SPTC)
register(MMASP)
_load_plugins()
