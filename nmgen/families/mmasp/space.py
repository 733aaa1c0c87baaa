"""The ``mma.sp`` family's search space, declared once (``SPACE``)."""

from __future__ import annotations

from typing import Any

from ...problem import Problem
from ..space import Param, SearchSpace
from .config import (
    BLOCK_MS,
    BLOCK_NS,
    FAMILY,
    MAX_WARP_TILES_M,
    MAX_WARP_TILES_N,
    MMA_M,
    MMA_N,
    WARPS,
    MmaSpConfig,
)

SPACE_PARAMS = (
    Param("bm", BLOCK_MS),  # output columns a block
    Param("bn", BLOCK_NS),  # rows of A a block
    Param("warps_m", WARPS),
    Param("warps_n", WARPS),
    Param("stages", (2, 3, 4, 5, 6)),
    Param("split_k", (1, 2, 4, 8, 16)),
)


class _Mapping:
    """The tuned parameters are fields of the configuration; the problem gives the rest."""

    names = tuple(p.name for p in SPACE_PARAMS)

    def allowed(self, problem: Problem, param: str, choices: tuple) -> tuple:
        return choices

    def build(self, problem: Problem, values: dict[str, Any]) -> MmaSpConfig:
        return MmaSpConfig(n=problem.n, m=problem.m, vec=problem.vec,
                           a_layout=problem.a_layout, arch=problem.arch, dtype=problem.dtype,
                           **{name: values[name] for name in self.names})

    def values_of(self, config: MmaSpConfig) -> dict[str, Any]:
        return {name: getattr(config, name) for name in self.names}

    def quick_reject(self, values: dict[str, Any]) -> bool:
        tiles_m, rest_m = divmod(values["bm"], MMA_M * values["warps_m"])
        tiles_n, rest_n = divmod(values["bn"], MMA_N * values["warps_n"])
        return (rest_m != 0 or rest_n != 0 or not 1 <= tiles_m <= MAX_WARP_TILES_M
                or not 1 <= tiles_n <= MAX_WARP_TILES_N)


SPACE = SearchSpace(FAMILY, SPACE_PARAMS, _Mapping())
