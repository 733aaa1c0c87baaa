"""The FP32 SIMT family: fp32 values and activations on CUDA cores (docs/design.md §2-3)."""

from __future__ import annotations

import math

from ...format import DType
from ...problem import ALayout, Problem
from ..base import ModularFamily, enumeration
from ..space import ConfigError, SearchSpace
from .config import FAMILY, ATile, KernelConfig
from .space import SPACE, SUBSPACES, core_config


class F32Simt(ModularFamily):
    name = FAMILY
    title = "FP32 SIMT (CUDA cores)"
    dtypes = frozenset({DType.F32})
    space = SPACE
    subspaces = SUBSPACES
    config_type = KernelConfig
    name_prefix = f"nm_spmm_{FAMILY}_"
    untuned_candidates = "default_candidates"

    def seed_candidates(self, problem: Problem, space: SearchSpace) -> list[KernelConfig]:
        """The enumeration, less landing tiles for row-major A (rarely the best)."""
        candidates = enumeration(self, problem, space)
        if problem.a_layout is ALayout.ROW_MAJOR:
            return [c for c in candidates if c.a_tile is not ATile.K_MAJOR] or list(candidates)
        return list(candidates)

    def default_candidates(self, problem: Problem, space: SearchSpace) -> list[KernelConfig]:
        """The enumeration's kernels of the A tile the untuned choice takes: M-major for
        row-major A, K-major for K-major A."""
        tile = ATile.M_MAJOR if problem.a_layout is ALayout.ROW_MAJOR else ATile.K_MAJOR
        return [c for c in enumeration(self, problem, space) if c.a_tile is tile]

    def seed_shape(self, config: KernelConfig) -> tuple:
        """The tile shape and pipeline: seeds differ in more than their warp layout, split
        or copy engine."""
        return (config.ms, config.ns, config.ks, config.mt, config.nt, config.packing,
                config.stages, config.a_tile)

    def seed_variants(self, best: KernelConfig, space: SearchSpace) -> list[KernelConfig]:
        """The best guess split (split-K) and run by the stream-K grid."""
        problem = Problem(best.n, best.m, best.vec, best.a_layout, best.arch)
        values, choices = space.values_of(best), space.choices(problem)
        variants = [{**values, "split_k": s} for s in choices["split_k"] if s > 1]
        if True in choices["stream_k"]:
            variants.append({**values, "stream_k": True})
        return [c for v in variants if (c := space.config(problem, v)) is not None]

    def refinements(self, config: KernelConfig) -> list[KernelConfig]:
        """The stream-K twin (split-K and sliced K back to 1): it fills a last wave the
        tiles leave mostly empty, which the search rarely finds on its own."""
        try:
            return [] if config.stream_k else [config.replace(stream_k=True, split_k=1,
                                                               slice_k=1)]
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


F32_SIMT = F32Simt()
