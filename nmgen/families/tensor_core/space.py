"""The search-space mapping of a tensor-core family (``SpaceMapping``): the tuned
parameters are fields of its configuration (the tile, the windows a stage, the warp
fields, the stages); the problem gives the rest."""

from __future__ import annotations

from typing import Any, ClassVar

from ...problem import Problem
from .config import MAX_STAGE_ROWS, TensorCoreConfig


class TensorCoreMapping:
    """A family sets ``config_type`` and says which value combinations its rules surely
    refuse (``quick_reject``); ``multi_group``: whether a block may span several column
    groups (``bn`` a multiple of L) or stays inside one (``bn`` a divisor of L)."""

    config_type: ClassVar[type[TensorCoreConfig]]
    multi_group: ClassVar[bool] = False

    @property
    def names(self) -> tuple[str, ...]:
        """The tuned parameters, in the space's order."""
        return ("bm", "bn", "windows", *self.config_type.warp_fields, "stages")

    def allowed(self, problem: Problem, param: str, choices: tuple) -> tuple:
        if param == "bn":
            return tuple(b for b in choices if problem.vec % b == 0
                         or (self.multi_group and b % problem.vec == 0)) or choices[:1]
        if param == "windows":
            fits = tuple(w for w in choices if self.windows_fit(problem, w))
            return fits or choices[-1:]
        return choices

    def windows_fit(self, problem: Problem, windows: int) -> bool:
        """Whether a stage of ``windows`` windows is whole ``k16`` steps of at most
        ``MAX_STAGE_ROWS`` compressed rows."""
        rows = windows * problem.n
        return rows % 16 == 0 and rows <= MAX_STAGE_ROWS

    def build(self, problem: Problem, values: dict[str, Any]) -> TensorCoreConfig:
        tuned = {name: values[name] for name in self.names}
        return self.config_type(n=problem.n, m=problem.m, vec=problem.vec,  # type: ignore[call-arg]
                                a_layout=problem.a_layout, arch=problem.arch,
                                dtype=problem.dtype, **tuned)

    def values_of(self, config: TensorCoreConfig) -> dict[str, Any]:
        return {name: getattr(config, name) for name in self.names}

    def quick_reject(self, values: dict[str, Any]) -> bool:
        raise NotImplementedError
