"""The decode family's search space, declared once (``SPACE``)."""

from __future__ import annotations

from typing import Any

from ...problem import Problem
from ..space import Param, SearchSpace
from .config import FAMILY, LOAD_BYTES, GemvConfig

KC_MAX = 1024

SPACE_PARAMS = (
    Param("rows", (1, 2, 4, 8, 16, 32, 64)),  # rows of A a block holds
    Param("threads", (64, 128, 256)),
    Param("cols", (1, 2, 4, 8)),  # consecutive columns a thread loads at once
    Param("kc_windows", (1, 2, 4, 8, 16, 32, 64)),  # KC = m * windows, at most KC_MAX
    Param("unroll", (1, 2, 4, 8)),  # compressed rows whose loads go out together
    Param("split_k", (1, 2, 4, 8, 16, 32)),
)


class _Mapping:
    def allowed(self, problem: Problem, param: str, choices: tuple) -> tuple:
        if param == "cols":
            return tuple(c for c in choices if c * problem.dtype.itemsize in LOAD_BYTES)
        if param == "kc_windows":
            return tuple(w for w in choices if problem.m * w <= KC_MAX) or choices[:1]
        return choices

    def build(self, problem: Problem, values: dict[str, Any]) -> GemvConfig:
        return GemvConfig(problem.n, problem.m, problem.vec, values["rows"], values["threads"],
                          values["cols"], problem.m * values["kc_windows"], values["unroll"],
                          values["split_k"], problem.a_layout, problem.arch, problem.dtype)

    def values_of(self, config: GemvConfig) -> dict[str, Any]:
        return {"rows": config.rows, "threads": config.threads, "cols": config.cols,
                "kc_windows": config.kc // config.m, "unroll": config.unroll,
                "split_k": config.split_k}

    def quick_reject(self, values: dict[str, Any]) -> bool:
        return values["rows"] * values["cols"] > 128


SPACE = SearchSpace(FAMILY, SPACE_PARAMS, _Mapping())
