"""The decode family's search space, declared once (``SPACE``)."""

from __future__ import annotations

from typing import Any

from ...problem import Problem
from ..space import Param, SearchSpace
from .config import FAMILY, LOAD_BYTES, GemvConfig

SPACE_PARAMS = (
    Param("rows", (1, 2, 4, 8, 16, 32, 64)),  # rows of A a block holds
    Param("col_threads", (32, 64, 128, 256)),  # threads along N
    Param("lanes", (1, 2, 4, 8, 16)),  # threads along K
    Param("cols", (1, 2, 4, 8)),  # consecutive columns a thread loads at once
    Param("unroll", (1, 2, 4, 8)),  # compressed rows whose loads go out together
    Param("split_k", (1, 2, 4, 8, 16, 32, 64, 128)),  # slices of K aimed at
    Param("prefetch", (0, 1, 2)),  # groups of UNROLL rows loaded ahead of the FMAs
)


class _Mapping:
    def allowed(self, problem: Problem, param: str, choices: tuple) -> tuple:
        if param == "cols":
            return tuple(c for c in choices if c * problem.dtype.itemsize in LOAD_BYTES)
        return choices

    def build(self, problem: Problem, values: dict[str, Any]) -> GemvConfig:
        return GemvConfig(problem.n, problem.m, problem.vec, values["rows"],
                          values["col_threads"], values["lanes"], values["cols"],
                          values["unroll"], values["split_k"], values["prefetch"],
                          problem.a_layout, problem.arch, problem.dtype)

    def values_of(self, config: GemvConfig) -> dict[str, Any]:
        return {"rows": config.rows, "col_threads": config.col_threads, "lanes": config.lanes,
                "cols": config.cols, "unroll": config.unroll, "split_k": config.split_k,
                "prefetch": config.prefetch}

    def quick_reject(self, values: dict[str, Any]) -> bool:
        return (values["rows"] * values["cols"] > 128
                or values["col_threads"] * values["lanes"] > 1024)


SPACE = SearchSpace(FAMILY, SPACE_PARAMS, _Mapping())
