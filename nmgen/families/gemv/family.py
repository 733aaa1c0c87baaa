"""The decode family: small M (1-64, token-by-token generation) at the memory bound, in
FP32, BF16 and FP16 (DESIGN §9)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...cache import cache_file, load_or_build
from ...format import DType, NMMatrix
from ...gpus import GpuSpec
from ...problem import Problem
from ...shapes import Shape
from ..base import EPILOGUE_TEMPLATE, Family, PreparedWeight
from ..plan import Call, Device, LaunchPlan
from ..space import SearchSpace
from . import launch, model, prepare, render
from .config import FAMILY, GemvConfig
from .space import SPACE

MAX_TUNED_ROWS = 64  # the largest M a tune of every family spends gemv trials on

HERE = Path(__file__).resolve().parent


class Gemv(Family):
    name = FAMILY
    title = "decode (small M, memory-bound)"
    dtypes = frozenset({DType.F32, DType.BF16, DType.F16})
    space = SPACE
    subspaces = {"full": SPACE}

    def tunes(self, shape: Shape) -> bool:
        """Small M only: each block holds its rows of A on chip and streams the weight
        once per ``rows``; at M > 64 the tiled families win."""
        return shape[0] <= MAX_TUNED_ROWS

    def config_from_dict(self, values: dict[str, Any]) -> GemvConfig:
        return GemvConfig.from_dict(values)

    def config_from_name(self, name: str) -> GemvConfig | None:
        if not name.startswith(f"nm_{FAMILY}_"):
            return None
        return GemvConfig.from_name(name)

    def feasible(self, config: GemvConfig, gpu: GpuSpec) -> str | None:
        return model.feasible(config, gpu)

    def estimate_ms(self, config: GemvConfig, gpu: GpuSpec, shape: Shape) -> float:
        return model.estimate_ms(config, gpu, shape)

    def ranker(self, configs: Sequence[GemvConfig], gpu: GpuSpec) -> model.RankTable:
        return model.RankTable(list(configs), gpu)

    def seed_candidates(self, problem: Problem, space: SearchSpace) -> list[GemvConfig]:
        """The space's configurations but the wide sums: the model does not tell one from
        its twin, which dispatch and the seeds keep until a record says otherwise."""
        return [c for c in enumeration(problem, space) if not c.wide_sum]

    def seed_shape(self, config: GemvConfig) -> tuple:
        """Seeds differ in more than their unroll."""
        return (config.rows, config.col_threads, config.lanes, config.cols, config.split_k)

    def refinements(self, config: GemvConfig) -> list[GemvConfig]:
        """A split-K winner's twin whose last block sums the slices with wide loads."""
        return [config.replace(wide_sum=1)] if config.split_k > 1 and not config.wide_sum \
            else []

    @property
    def templates(self) -> Path:
        return HERE / "templates"

    def template_name(self, config: GemvConfig) -> str:
        return render.TEMPLATE

    def template_arguments(self, config: GemvConfig) -> dict[str, Any]:
        return render.template_arguments(config)

    def entry_points(self, config: GemvConfig) -> tuple[str, ...]:
        return render.entry_points(config)

    def generator_files(self) -> tuple[Path, ...]:
        return (self.templates / render.TEMPLATE, EPILOGUE_TEMPLATE, HERE / "render.py")

    def prepare(self, weight: NMMatrix, config: GemvConfig) -> PreparedWeight:
        return prepare.prepare(weight, config)

    def layout_key(self, config: GemvConfig) -> Any:
        return prepare.layout_key(config)

    def plan(self, config: GemvConfig, weight: PreparedWeight, shape: tuple[int, int],
             call: Call, device: Device) -> LaunchPlan:
        return launch.plan(config, weight, shape, call, device)


@functools.cache
def enumeration(problem: Problem, space: SearchSpace) -> tuple[GemvConfig, ...]:
    """Every valid configuration of ``space`` for ``problem`` (cached in the process and on
    disk)."""
    path = cache_file("space", (FAMILY, problem, space), GEMV.source_files())
    return load_or_build(path, lambda: tuple(space.enumerate(problem)), tuple)


GEMV = Gemv()
