"""The Hopper tensor-core family: BF16 and FP16 values and activations on
``wgmma.mma_async`` (sm_90a), FP32 accumulation, output in the input dtype (DESIGN §8)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...cache import cache_file, load_or_build
from ...format import NMMatrix
from ...gpus import Arch, GpuSpec
from ...problem import ALayout, Problem
from ...shapes import Shape
from ..base import EPILOGUE_TEMPLATE, Family, PreparedWeight
from ..plan import Call, Device, LaunchPlan
from ..space import SearchSpace
from . import launch, model, prepare, render
from .config import DTYPES, FAMILY, TARGET, WgmmaConfig
from .space import SPACE

SERVED_VECS = frozenset({64, 128, 256})  # multiples of the narrowest block (64 columns)
MAX_SERVED_M = 64  # window size m the family serves

HERE = Path(__file__).resolve().parent


class Wgmma(Family):
    name = FAMILY
    title = "Hopper tensor cores (wgmma, BF16/FP16)"
    dtypes = DTYPES
    space = SPACE
    subspaces = {"full": SPACE}

    def serves(self, problem: Problem) -> str | None:
        refused = super().serves(problem)
        if refused is not None:
            return refused
        if problem.arch is not Arch.SM90:
            return f"{FAMILY} kernels need sm_90 (wgmma)"
        if problem.a_layout is not ALayout.K_MAJOR:
            return f"{FAMILY} kernels take K-major A"
        if problem.vec not in SERVED_VECS:
            return f"{FAMILY} kernels take L in {sorted(SERVED_VECS)}"
        if problem.m > MAX_SERVED_M:
            return f"{FAMILY} kernels take m <= {MAX_SERVED_M}"
        return None

    def config_from_dict(self, values: dict[str, Any]) -> WgmmaConfig:
        return WgmmaConfig.from_dict(values)

    def config_from_name(self, name: str) -> WgmmaConfig | None:
        if not name.startswith(f"nm_{FAMILY}_"):
            return None
        return WgmmaConfig.from_name(name)

    def compile_target(self, config: WgmmaConfig) -> str:
        return TARGET

    def feasible(self, config: WgmmaConfig, gpu: GpuSpec) -> str | None:
        return model.feasible(config, gpu)

    def estimate_ms(self, config: WgmmaConfig, gpu: GpuSpec, shape: Shape) -> float:
        return model.estimate_ms(config, gpu, shape)

    def ranker(self, configs: Sequence[WgmmaConfig], gpu: GpuSpec) -> model.RankTable:
        return model.RankTable(list(configs), gpu)

    def seed_candidates(self, problem: Problem, space: SearchSpace) -> list[WgmmaConfig]:
        return list(enumeration(problem, space))

    def seed_shape(self, config: WgmmaConfig) -> tuple:
        """Seeds differ in more than their pipeline depth."""
        return (config.bm, config.bn, config.windows, config.warpgroups)

    @property
    def templates(self) -> Path:
        return HERE / "templates"

    def template_name(self, config: WgmmaConfig) -> str:
        return render.TEMPLATE

    def template_arguments(self, config: WgmmaConfig) -> dict[str, Any]:
        return render.template_arguments(config)

    def entry_points(self, config: WgmmaConfig) -> tuple[str, ...]:
        return render.entry_points(config)

    def generator_files(self) -> tuple[Path, ...]:
        return (self.templates / render.TEMPLATE, EPILOGUE_TEMPLATE, HERE / "render.py")

    def prepare(self, weight: NMMatrix, config: WgmmaConfig) -> PreparedWeight:
        return prepare.prepare(weight, config)

    def layout_key(self, config: WgmmaConfig) -> Any:
        return prepare.layout_key(config)

    def plan(self, config: WgmmaConfig, weight: PreparedWeight, shape: tuple[int, int],
             call: Call, device: Device) -> LaunchPlan:
        return launch.plan(config, weight, shape, call, device)


@functools.cache
def enumeration(problem: Problem, space: SearchSpace) -> tuple[WgmmaConfig, ...]:
    """Every valid configuration of ``space`` for ``problem`` (cached in the process and on
    disk)."""
    path = cache_file("space", (FAMILY, problem, space), WGMMA.source_files())
    return load_or_build(path, lambda: tuple(space.enumerate(problem)), tuple)


WGMMA = Wgmma()
