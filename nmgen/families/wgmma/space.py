"""The wgmma family's search space, declared once (``SPACE``)."""

from __future__ import annotations

from typing import Any

from ...problem import Problem
from ..space import Param, SearchSpace
from .config import BLOCK_NS, FAMILY, MAX_STAGE_ROWS, WgmmaConfig

SPACE_PARAMS = (
    Param("bm", (64, 128, 256)),  # block tile rows: 64 * tiles_m * warpgroups
    Param("bn", BLOCK_NS),  # block tile columns (a divisor of L)
    Param("windows", (1, 2, 4, 8, 16, 32)),  # windows a stage: bk = windows * n
    Param("warpgroups", (1, 2)),
    Param("stages", (3, 4, 5)),
)


class _Mapping:
    def allowed(self, problem: Problem, param: str, choices: tuple) -> tuple:
        if param == "bn":
            return tuple(b for b in choices if problem.vec % b == 0) or choices[:1]
        if param == "windows":
            fits = tuple(w for w in choices if (w * problem.n) % 16 == 0
                         and w * problem.n <= MAX_STAGE_ROWS)
            return fits or choices[-1:]
        return choices

    def build(self, problem: Problem, values: dict[str, Any]) -> WgmmaConfig:
        return WgmmaConfig(problem.n, problem.m, problem.vec, values["bm"], values["bn"],
                           values["windows"], values["warpgroups"], values["stages"],
                           problem.a_layout, problem.arch, problem.dtype)

    def values_of(self, config: WgmmaConfig) -> dict[str, Any]:
        return {"bm": config.bm, "bn": config.bn, "windows": config.windows,
                "warpgroups": config.warpgroups, "stages": config.stages}

    def quick_reject(self, values: dict[str, Any]) -> bool:
        tiles_m, rest = divmod(values["bm"], 64 * values["warpgroups"])
        return rest != 0 or not 1 <= tiles_m <= 2


SPACE = SearchSpace(FAMILY, SPACE_PARAMS, _Mapping())
