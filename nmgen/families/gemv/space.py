"""The decode family's search space, declared once (``SPACE``)."""

from __future__ import annotations

from typing import Any

from ...problem import Problem
from ..space import ConfigError, Param, SearchSpace
from .config import FAMILY, LOAD_BYTES, GemvConfig

SPACE_PARAMS = (
    Param("rows", (1, 2, 4, 8, 16, 32, 64)),  # rows of A a block holds
    Param("col_threads", (32, 64, 128, 256)),  # threads along N
    Param("lanes", (1, 2, 4, 8, 16)),  # threads along K
    Param("cols", (1, 2, 4, 8)),  # consecutive columns a thread loads at once
    Param("unroll", (1, 2, 4, 8)),  # compressed rows whose loads go out together
    Param("split_k", (1, 2, 4, 8, 16, 32, 64, 128)),  # slices of K aimed at
    Param("prefetch", (0, 1, 2)),  # groups of UNROLL rows loaded ahead of the FMAs
    Param("wide_sum", (0, 1)),  # the last block loads many slices' sums at once
)


class _Mapping:
    def allowed(self, problem: Problem, param: str, choices: tuple) -> tuple:
        if param == "cols":
            return tuple(c for c in choices if c * problem.dtype.itemsize in LOAD_BYTES)
        return choices

    def build(self, problem: Problem, values: dict[str, Any]) -> GemvConfig:
        if values["wide_sum"] and values["split_k"] == 1:
            raise ConfigError("wide_sum without split_k: its twin's kernel")
        return GemvConfig(problem.n, problem.m, problem.vec, values["rows"],
                          values["col_threads"], values["lanes"], values["cols"],
                          values["unroll"], values["split_k"], values["prefetch"],
                          values["wide_sum"], problem.a_layout, problem.arch, problem.dtype)

    def values_of(self, config: GemvConfig) -> dict[str, Any]:
        return {"rows": config.rows, "col_threads": config.col_threads, "lanes": config.lanes,
                "cols": config.cols, "unroll": config.unroll, "split_k": config.split_k,
                "prefetch": config.prefetch, "wide_sum": config.wide_sum}

    def quick_reject(self, values: dict[str, Any]) -> bool:
        return (values["rows"] * values["cols"] > 128
                or values["col_threads"] * values["lanes"] > 1024
                or (values["wide_sum"] == 1 and values["split_k"] == 1))  # its twin's kernel


SPACE = SearchSpace(FAMILY, SPACE_PARAMS, _Mapping())
