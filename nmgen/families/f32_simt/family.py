"""The FP32 SIMT family: fp32 values and activations on CUDA cores (DESIGN §2-3)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...cache import cache_file, load_or_build
from ...format import DType, NMMatrix
from ...gpus import GpuSpec
from ...problem import ALayout, Problem
from ...shapes import Shape
from ..base import EPILOGUE_TEMPLATE, Family, PreparedWeight
from ..plan import Call, Device, LaunchPlan
from ..space import ConfigError, SearchSpace
from . import launch, model, render
from .config import FAMILY, ATile, KernelConfig
from .prepare import LayoutKey, prepare_layout
from .space import SPACE, SUBSPACES, core_config

HERE = Path(__file__).resolve().parent


class F32Simt(Family):
    name = FAMILY
    title = "FP32 SIMT (CUDA cores)"
    dtypes = frozenset({DType.F32})
    space = SPACE
    subspaces = SUBSPACES

    # ------------------------------------------------------------ configuration
    def config_from_dict(self, values: dict[str, Any]) -> KernelConfig:
        return KernelConfig.from_dict(values)

    def config_from_name(self, name: str) -> KernelConfig | None:
        if not name.startswith(f"nm_spmm_{FAMILY}_"):
            return None
        return KernelConfig.from_name(name)

    # ------------------------------------------------------------ resources and model
    def feasible(self, config: KernelConfig, gpu: GpuSpec) -> str | None:
        return model.feasible(config, gpu)

    def estimate_ms(self, config: KernelConfig, gpu: GpuSpec, shape: Shape) -> float:
        return model.estimate(config, gpu, *shape).time_ms

    def ranker(self, configs: Sequence[KernelConfig], gpu: GpuSpec) -> model.RankTable:
        return model.RankTable(configs, gpu)

    def seed_candidates(self, problem: Problem, space: SearchSpace) -> list[KernelConfig]:
        """The enumeration, less landing tiles for row-major A (rarely the best)."""
        candidates = enumeration(problem, space)
        if problem.a_layout is ALayout.ROW_MAJOR:
            return [c for c in candidates if c.a_tile is not ATile.K_MAJOR] or list(candidates)
        return list(candidates)

    def seed_shape(self, config: KernelConfig) -> tuple:
        """The tile shape and pipeline: seeds differ in more than their warp layout, split
        or copy engine."""
        return (config.ms, config.ns, config.ks, config.mt, config.nt, config.packing,
                config.stages, config.a_tile)

    def seed_variants(self, best: KernelConfig, space: SearchSpace) -> list[KernelConfig]:
        """The best guess split (split-K) and run by the stream-K grid."""
        values = space.values_of(best)
        variants = [{**values, "split_k": s} for s in space.choices(_problem(best))["split_k"]
                    if s > 1]
        if True in space.choices(_problem(best))["stream_k"]:
            variants.append({**values, "stream_k": True})
        return [c for v in variants if (c := space.config(_problem(best), v)) is not None]

    def refinements(self, config: KernelConfig) -> list[KernelConfig]:
        """The stream-K twin (split-K and sliced K back to 1): it fills a last wave the
        tiles leave mostly empty, which the search rarely finds on its own."""
        if config.stream_k:
            return []
        try:
            return [config.replace(stream_k=True, split_k=1, slice_k=1)]
        except ConfigError:
            return []

    def adapt(self, config: KernelConfig, problem: Problem) -> KernelConfig | None:
        """The same tiles and pipeline for ``problem``, with the stage depth ``KS`` the
        space allows nearest the tuned one (the dense window of A a stage holds)."""
        values = self.space.values_of(config)
        windows = min(self.space.choices(problem)["ks_windows"],
                      key=lambda w: (abs(math.log(problem.m * w / config.ks)), w))
        adapted = self.space.config(problem, {**values, "ks_windows": windows})
        if adapted is not None and self.in_space(adapted, problem):
            return adapted
        return super().adapt(config, problem)

    def reference_config(self, problem: Problem) -> KernelConfig | None:
        return core_config(problem)

    def default_config(self, problem: Problem, gpu: GpuSpec, shape: Shape
                       ) -> KernelConfig | None:
        """The model's best of the enumeration; row-major A on the M-major tile."""
        ranked = _default_table(problem, self.space, gpu).rank(*shape)
        return ranked[0][1] if ranked else None

    # ------------------------------------------------------------ code generation
    @property
    def templates(self) -> Path:
        return HERE / "templates"

    def template_name(self, config: KernelConfig) -> str:
        return render.TEMPLATE

    def template_arguments(self, config: KernelConfig) -> dict[str, Any]:
        return render.template_arguments(config)

    def entry_points(self, config: KernelConfig) -> tuple[str, ...]:
        return render.entry_points(config)

    def generator_files(self) -> tuple[Path, ...]:
        return (self.templates / render.TEMPLATE, EPILOGUE_TEMPLATE, HERE / "render.py")

    # ------------------------------------------------------------ weight and launch
    def prepare(self, weight: NMMatrix, config: KernelConfig) -> PreparedWeight:
        return prepare_layout(weight, config)

    def layout_key(self, config: KernelConfig) -> LayoutKey:
        return LayoutKey.of(config)

    def plan(self, config: KernelConfig, weight: PreparedWeight, shape: tuple[int, int],
             call: Call, device: Device) -> LaunchPlan:
        return launch.plan(config, weight, shape, call, device)


def _problem(config: KernelConfig) -> Problem:
    return Problem(config.n, config.m, config.vec, config.a_layout, config.arch)


@functools.cache
def enumeration(problem: Problem, space: SearchSpace) -> tuple[KernelConfig, ...]:
    """Every valid configuration of ``space``'s enumerated values for ``problem``. Cached
    in the process and on disk: building it took 2.8 s for the 43,362 of row-major 8:32,
    reading it back 0.14 s, and every tuning worker needs it before its first study."""
    path = cache_file("space", (FAMILY, problem, space), F32_SIMT.source_files())
    return load_or_build(path, lambda: tuple(space.enumerate(problem)), tuple)


F32_SIMT = F32Simt()


@functools.lru_cache(maxsize=32)
def _default_table(problem: Problem, space: SearchSpace, gpu: GpuSpec) -> model.RankTable:
    """The enumeration's kernels of the A tile ``default_config`` takes (M-major for
    row-major A), ranked by the model: built once a problem and GPU."""
    tile = ATile.M_MAJOR if problem.a_layout is ALayout.ROW_MAJOR else ATile.K_MAJOR
    return model.RankTable([c for c in enumeration(problem, space) if c.a_tile is tile], gpu)
