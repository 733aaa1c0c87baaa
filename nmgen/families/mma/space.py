"""The tensor-core family's search space, declared once (``SPACE``)."""

from __future__ import annotations

from typing import Any

from ...problem import ALayout, Problem
from ..space import Param, SearchSpace
from .config import FAMILY, MAX_STAGE_ROWS, MAX_THREADS, MmaConfig

SPACE_PARAMS = (
    Param("bm", (16, 32, 64, 128, 256)),  # block tile rows
    Param("bn", (8, 16, 32, 64, 128, 256)),  # block tile columns (a divisor of L)
    Param("windows", (1, 2, 4, 8, 16, 32)),  # windows a stage: bk = windows * n
    Param("warps_m", (1, 2, 4, 8)),
    Param("warps_n", (1, 2, 4)),
    Param("stages", (2, 3, 4)),
)


class _Mapping:
    def allowed(self, problem: Problem, param: str, choices: tuple) -> tuple:
        if param == "bn":
            return tuple(b for b in choices if problem.vec % b == 0) or choices[:1]
        if param == "windows":
            fits = tuple(w for w in choices if (w * problem.n) % 16 == 0
                         and w * problem.n <= MAX_STAGE_ROWS
                         and (problem.a_layout is ALayout.K_MAJOR or w * problem.m % 8 == 0))
            return fits or choices[-1:]
        return choices

    def build(self, problem: Problem, values: dict[str, Any]) -> MmaConfig:
        return MmaConfig(problem.n, problem.m, problem.vec, values["bm"], values["bn"],
                         values["windows"], values["warps_m"], values["warps_n"],
                         values["stages"], problem.a_layout, problem.arch, problem.dtype)

    def values_of(self, config: MmaConfig) -> dict[str, Any]:
        return {"bm": config.bm, "bn": config.bn, "windows": config.windows,
                "warps_m": config.warps_m, "warps_n": config.warps_n, "stages": config.stages}

    def quick_reject(self, values: dict[str, Any]) -> bool:
        return (values["bm"] % (16 * values["warps_m"]) != 0
                or values["bn"] % (8 * values["warps_n"]) != 0
                or 32 * values["warps_m"] * values["warps_n"] > MAX_THREADS)


SPACE = SearchSpace(FAMILY, SPACE_PARAMS, _Mapping())
