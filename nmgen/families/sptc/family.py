"""The sparse-tensor-core family (``sptc``): weights whose kept elements fit the hardware's
2:4 (element-wise 2:4 checkpoints, 1:4, 1:2, 2:8, ... at any L) on
``wgmma.mma_async.sp`` (sm_90a), BF16 and FP16, FP32 accumulation (docs/design.md §12)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...cache import cache_file, load_or_build
from ...format import NMMatrix
from ...gpus import Arch, GpuSpec
from ...problem import Problem
from ...shapes import Shape
from ..base import EPILOGUE_TEMPLATE, SHARED_TEMPLATES, TRANSPOSE_TEMPLATE, Family, PreparedWeight
from ..plan import Call, Device, LaunchPlan
from ..space import SearchSpace
from . import launch, model, prepare, render
from .config import DTYPES, FAMILY, TARGET, SptcConfig, worst_group_count
from .space import SPACE

HERE = Path(__file__).resolve().parent
DEVICE_TEMPLATE = SHARED_TEMPLATES / "device.cuh.j2"


class Sptc(Family):
    name = FAMILY
    title = "Hopper sparse tensor cores (wgmma.sp, 2:4, BF16/FP16)"
    dtypes = DTYPES
    space = SPACE
    subspaces = {"full": SPACE}

    def serves(self, problem: Problem) -> str | None:
        """Patterns whose every weight fits 2:4 (at most two kept elements in each aligned
        group of four along K: 2:4, 1:4, 1:2, 2:8, ...), any L, on sm_90."""
        refused = super().serves(problem)
        if refused is not None:
            return refused
        if problem.arch is not Arch.SM90:
            return f"{FAMILY} kernels need sm_90 (wgmma.mma_async.sp)"
        worst = worst_group_count(problem.n, problem.m)
        if worst > 2:
            return (f"{FAMILY} kernels take patterns whose kept elements fit 2:4; "
                    f"{problem.pattern} can keep {worst} of an aligned group of four")
        return None

    def config_from_dict(self, values: dict[str, Any]) -> SptcConfig:
        return SptcConfig.from_dict(values)

    def config_from_name(self, name: str) -> SptcConfig | None:
        if not name.startswith(f"nm_{FAMILY}_"):
            return None
        return SptcConfig.from_name(name)

    def compile_target(self, config: SptcConfig) -> str:
        return TARGET

    def feasible(self, config: SptcConfig, gpu: GpuSpec) -> str | None:
        return model.feasible(config, gpu)

    def estimate_ms(self, config: SptcConfig, gpu: GpuSpec, shape: Shape) -> float:
        return model.estimate_ms(config, gpu, shape)

    def ranker(self, configs: Sequence[SptcConfig], gpu: GpuSpec) -> model.RankTable:
        return model.RankTable(configs, gpu)

    def seed_candidates(self, problem: Problem, space: SearchSpace) -> list[SptcConfig]:
        return list(enumeration(problem, space))

    def seed_shape(self, config: SptcConfig) -> tuple:
        """Seeds differ in more than their pipeline depth."""
        return (config.bm, config.bn, config.warpgroups, config.split_k)

    @property
    def templates(self) -> Path:
        return HERE / "templates"

    def template_name(self, config: SptcConfig) -> str:
        return render.TEMPLATE

    def template_arguments(self, config: SptcConfig) -> dict[str, Any]:
        return render.template_arguments(config)

    def entry_points(self, config: SptcConfig) -> tuple[str, ...]:
        return render.entry_points(config)

    def generator_files(self) -> tuple[Path, ...]:
        return (self.templates / render.TEMPLATE, DEVICE_TEMPLATE, EPILOGUE_TEMPLATE,
                TRANSPOSE_TEMPLATE, HERE / "render.py")

    def prepare(self, weight: NMMatrix, config: SptcConfig) -> PreparedWeight:
        return prepare.prepare(weight, config)

    def layout_key(self, config: SptcConfig) -> Any:
        return prepare.layout_key(config)

    def plan(self, config: SptcConfig, weight: PreparedWeight, shape: tuple[int, int],
             call: Call, device: Device) -> LaunchPlan:
        return launch.plan(config, weight, shape, call, device)


@functools.cache
def enumeration(problem: Problem, space: SearchSpace) -> tuple[SptcConfig, ...]:
    """Every valid configuration of ``space`` for ``problem`` (cached in the process and on
    disk)."""
    path = cache_file("space", (FAMILY, problem, space), SPTC.source_files())
    return load_or_build(path, lambda: tuple(space.enumerate(problem)), tuple)


SPTC = Sptc()
