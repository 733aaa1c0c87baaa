"""The sparse-tensor-core family's search space, declared once (``SPACE``)."""

from __future__ import annotations

from typing import Any

from ...problem import Problem
from ..space import Param, SearchSpace
from .config import BLOCK_MS, BLOCK_NS, FAMILY, SptcConfig

SPACE_PARAMS = (
    Param("bm", BLOCK_MS),  # output columns a block: 64 * tiles_m * warpgroups
    Param("bn", BLOCK_NS),  # rows of A a block
    Param("warpgroups", (1, 2)),
    Param("stages", (3, 4, 5, 6, 8)),  # 2 (no stage in flight) only by name
    Param("split_k", (1, 2, 4, 8, 16)),
)


class _Mapping:
    """The tuned parameters are fields of the configuration; the problem gives the rest."""

    names = tuple(p.name for p in SPACE_PARAMS)

    def allowed(self, problem: Problem, param: str, choices: tuple) -> tuple:
        return choices

    def build(self, problem: Problem, values: dict[str, Any]) -> SptcConfig:
        return SptcConfig(n=problem.n, m=problem.m, vec=problem.vec, a_layout=problem.a_layout,
                          arch=problem.arch, dtype=problem.dtype,
                          **{name: values[name] for name in self.names})

    def values_of(self, config: SptcConfig) -> dict[str, Any]:
        return {name: getattr(config, name) for name in self.names}

    def quick_reject(self, values: dict[str, Any]) -> bool:
        tiles_m, rest = divmod(values["bm"], 64 * values["warpgroups"])
        return rest != 0 or not 1 <= tiles_m <= 2


SPACE = SearchSpace(FAMILY, SPACE_PARAMS, _Mapping())
