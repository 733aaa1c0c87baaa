"""The tensor-core family's search space, declared once (``SPACE``)."""

from __future__ import annotations

from typing import Any

from ...problem import ALayout, Problem
from ..space import Param, SearchSpace
from ..tensor_core.space import TensorCoreMapping
from .config import FAMILY, MAX_THREADS, MmaConfig

SPACE_PARAMS = (
    Param("bm", (16, 32, 64, 128, 256)),  # block tile rows
    Param("bn", (8, 16, 32, 64, 128, 256)),  # block tile columns (a divisor or multiple of L)
    Param("windows", (1, 2, 4, 8, 16, 32)),  # windows a stage: bk = windows * n
    Param("warps_m", (1, 2, 4, 8)),
    Param("warps_n", (1, 2, 4)),
    Param("stages", (2, 3, 4)),
    Param("a_copy", (False, True)),  # row-major A: gathered in the kernel, or copied K-major
)


class _Mapping(TensorCoreMapping):
    """The tensor-core parameters and ``a_copy`` (row-major A only)."""

    config_type = MmaConfig
    multi_group = True

    @property
    def names(self) -> tuple[str, ...]:
        return (*super().names, "a_copy")

    def allowed(self, problem: Problem, param: str, choices: tuple) -> tuple:
        if param == "a_copy" and problem.a_layout is ALayout.K_MAJOR:
            return (False,)
        return super().allowed(problem, param, choices)

    def windows_fit(self, problem: Problem, windows: int) -> bool:
        """Row-major A: the window tile is whole 16-byte chunks."""
        return super().windows_fit(problem, windows) and (
            problem.a_layout is ALayout.K_MAJOR or windows * problem.m % 8 == 0)

    def quick_reject(self, values: dict[str, Any]) -> bool:
        return (values["bm"] % (16 * values["warps_m"]) != 0
                or values["bn"] % (8 * values["warps_n"]) != 0
                or 32 * values["warps_m"] * values["warps_n"] > MAX_THREADS)


SPACE = SearchSpace(FAMILY, SPACE_PARAMS, _Mapping())
