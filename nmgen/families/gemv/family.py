"""The decode family: small M (1-64, token-by-token generation) at the memory bound, in
FP32, BF16 and FP16 (docs/design.md §9)."""

from __future__ import annotations

from ...format import DType
from ...problem import Problem
from ...shapes import Shape
from ..base import ModularFamily, enumeration
from ..space import SearchSpace
from .config import FAMILY, GemvConfig
from .space import SPACE

MAX_TUNED_ROWS = 64  # the largest M a tune of every family spends gemv trials on


class Gemv(ModularFamily):
    name = FAMILY
    title = "decode (small M, memory-bound)"
    dtypes = frozenset({DType.F32, DType.BF16, DType.F16})
    space = SPACE
    subspaces = {"full": SPACE}
    config_type = GemvConfig

    def tunes(self, shape: Shape) -> bool:
        """Small M only: each block holds its rows of A on chip and streams the weight
        once per ``rows``; at M > 64 the tiled families win."""
        return shape[0] <= MAX_TUNED_ROWS

    def seed_candidates(self, problem: Problem, space: SearchSpace) -> list[GemvConfig]:
        """The space's configurations but the wide sums: the model does not tell one from
        its twin, which dispatch and the seeds keep until a record says otherwise."""
        return [c for c in enumeration(self, problem, space) if not c.wide_sum]

    def seed_shape(self, config: GemvConfig) -> tuple:
        """Seeds differ in more than their unroll."""
        return (config.rows, config.col_threads, config.lanes, config.cols, config.split_k)

    def refinements(self, config: GemvConfig) -> list[GemvConfig]:
        """A split-K winner's twin whose last block sums the slices with wide loads."""
        return [config.replace(wide_sum=1)] if config.split_k > 1 and not config.wide_sum \
            else []


GEMV = Gemv()
