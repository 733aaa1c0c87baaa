"""The FP32 SIMT family's search space, declared once (``SPACE``), and its hand-picked
reference kernels.

The tuner's Optuna parameters, the enumeration the model ranks, random sampling, the
subspaces of the exhaustive comparison and replay all derive from ``SPACE``.
"""

from __future__ import annotations

from typing import Any

from ...gpus import Arch
from ...problem import ALayout, Problem
from ..space import ConfigError, Param, SearchSpace
from .config import FAMILY, ATile, KernelConfig

KS_MAX = 256  # the largest stage depth the space offers (KS = m * windows)

SPACE_PARAMS = (
    Param("warp", ("8x4", "4x8", "16x2", "2x16", "32x1", "1x32")),  # lanes along M x N
    Param("ms", (16, 32, 64, 128, 256)),
    Param("ns", (32, 64, 128, 256, 512)),  # 512 halves the A traffic a FLOP of 256
    Param("ks_windows", (1, 2, 4, 8)),  # KS = m * windows, at most KS_MAX
    Param("mt", (4, 8, 16)),
    Param("nt", (4, 8, 16)),
    Param("packing", (False, True)),
    Param("stages", (1, 2, 3)),
    Param("split_k", (1, 2, 4), enumerated=(1,)),  # the model's best seed gets its splits
    # sliced K: more warps a block where tiles are few (small M)
    Param("slice_k", (1, 2, 4)),
    Param("stream_k", (False, True), enumerated=(False,), share=0.25),
    Param("tma", (False, True), share=0.5),  # the bulk copy engine: sm_90 only
    Param("a_tile", tuple(t.value for t in ATile)),  # tm, tr, tx: row-major A only
)


class _Mapping:
    """Parameter values to ``KernelConfig`` and back."""

    def allowed(self, problem: Problem, param: str, choices: tuple) -> tuple:
        if param == "a_tile" and problem.a_layout is not ALayout.ROW_MAJOR:
            return tuple(c for c in choices if c == ATile.K_MAJOR.value)
        if param == "tma" and problem.arch is not Arch.SM90:
            return tuple(c for c in choices if not c)
        if param == "ks_windows":
            return tuple(w for w in choices if problem.m * w <= KS_MAX) or choices[:1]
        return choices

    def build(self, problem: Problem, values: dict[str, Any]) -> KernelConfig:
        if problem.dtype.value != "f32":
            raise ConfigError(f"the {FAMILY} family takes f32, not {problem.dtype.value}")
        warp_m, warp_n = (int(x) for x in values["warp"].split("x"))
        return KernelConfig(
            n=problem.n, m=problem.m, vec=problem.vec, a_layout=problem.a_layout,
            arch=problem.arch, ms=values["ms"], ns=values["ns"],
            ks=problem.m * values["ks_windows"], mt=values["mt"], nt=values["nt"],
            warp_m=warp_m, warp_n=warp_n, packing=values["packing"], stages=values["stages"],
            split_k=values["split_k"], slice_k=values["slice_k"],
            stream_k=values["stream_k"], tma=values["tma"], a_tile=values["a_tile"])

    def values_of(self, config: KernelConfig) -> dict[str, Any]:
        return {"warp": f"{config.warp_m}x{config.warp_n}", "ms": config.ms, "ns": config.ns,
                "ks_windows": config.ks // config.m, "mt": config.mt, "nt": config.nt,
                "packing": config.packing, "stages": config.stages,
                "split_k": config.split_k, "slice_k": config.slice_k,
                "stream_k": config.stream_k, "tma": config.tma,
                "a_tile": config.a_tile.value}

    def quick_reject(self, values: dict[str, Any]) -> bool:
        """The warps do not tile the block, or the TMA path's own refusals: skipped here,
        as building a refused ``KernelConfig`` costs ~30 us over a million combinations."""
        warp_m, warp_n = (int(x) for x in values["warp"].split("x"))
        if values["ms"] % (values["mt"] * warp_m) or values["ns"] % (values["nt"] * warp_n):
            return True
        return values["tma"] and (values["packing"] or values["slice_k"] > 1)


SPACE = SearchSpace(FAMILY, SPACE_PARAMS, _Mapping())
# Small enough to time every configuration on a GPU in minutes (~1,000 at K-major 8:32):
# the warp layouts, block tiles and pipelines of the fastest kernels of the core
# benchmark and the tuned database; no packing, no split-K.
CORE_SPACE = SPACE.narrowed(warp=("8x4", "4x8", "16x2"), ms=(32, 64, 128, 256),
                            ns=(64, 128, 256, 512), packing=(False,), stages=(2, 3),
                            split_k=(1,), slice_k=(1,), stream_k=(False,))
# The space before sliced K and stream-K (the exhaustive tables of the comparison cover it).
UNSLICED_SPACE = SPACE.narrowed(slice_k=(1,), stream_k=(False,))
SUBSPACES = {"full": SPACE, "core": CORE_SPACE, "unsliced": UNSLICED_SPACE}


# The core benchmark's best hand-picked configuration of each pattern and A layout (H100,
# M = N = K = 4096, L = 32; results/core_tma_h100/bench_core.json, a grid of two block
# tiles, KS of 2 or 4 windows, 2 or 3 stages, with and without TMA copies). Unpacked, and
# all with the bulk copy engine's copies (tma): 128x256 blocks of 16x8 thread tiles in
# 8x4 warps, or for 8:32 and 4:32 64x256 blocks of 16x4 tiles in 4x8 warps. Row-major A is
# fastest copied K-major first ("tx"), then the K-major kernel. It is the reference a tuned
# shape must not fall below.
CORE_TILES = {
    "128x256": {"ms": 128, "ns": 256, "mt": 16, "nt": 8, "warp": "8x4"},
    "64x256": {"ms": 64, "ns": 256, "mt": 16, "nt": 4, "warp": "4x8"},
}
# (n, m): (block tile, KS windows, stages); the same kernel for both A layouts, behind the
# transpose for row-major A.
CORE_KERNELS: dict[tuple[int, int], tuple[str, int, int]] = {
    (16, 32): ("128x256", 2, 3),
    (12, 32): ("128x256", 4, 2),  # its TMA tables are uint16 (KernelConfig.table_bytes)
    (8, 32): ("64x256", 2, 2),
    (4, 32): ("64x256", 4, 2),
}
# Without the bulk copy engine (before sm_90): the best cp.async kernels of the same
# benchmark before TMA (results/core_h100/bench_core.json), 128x256 blocks of 16x8 tiles.
CORE_KERNELS_CP_ASYNC: dict[tuple[int, int], tuple[str, int, int]] = {
    (16, 32): ("128x256", 2, 2),
    (12, 32): ("128x256", 4, 2),
    (8, 32): ("128x256", 4, 2),
    (4, 32): ("128x256", 4, 2),
}
CORE_BEST: dict[tuple[int, int, ALayout], tuple[str, int, int, ATile]] = {
    (n, m, layout): (*kernel, ATile.K_MAJOR_COPY if layout is ALayout.ROW_MAJOR
                     else ATile.K_MAJOR)
    for (n, m), kernel in CORE_KERNELS.items() for layout in ALayout
}


def core_config(problem: Problem) -> KernelConfig | None:
    """The core benchmark's best hand-picked configuration for ``problem``'s pattern and A
    layout; ``None`` for a pattern it did not cover, for another dtype, or where the tile
    does not fit."""
    best = CORE_BEST.get((problem.n, problem.m, problem.a_layout))
    if best is None or problem.dtype.value != "f32":
        return None
    tile, windows, stages, a_tile = best
    tma = problem.arch is Arch.SM90
    if not tma:
        tile, windows, stages = CORE_KERNELS_CP_ASYNC[(problem.n, problem.m)]
    return SPACE.config(problem, {
        **CORE_TILES[tile], "ks_windows": windows, "packing": False, "stages": stages,
        "split_k": 1, "slice_k": 1, "stream_k": False, "tma": tma, "a_tile": a_tile.value})


