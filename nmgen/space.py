"""The configuration space of a pattern: the values each parameter may take.

The tuner searches it; the tests sample it. Sampling draws each parameter from its
candidate list and keeps only what ``KernelConfig`` accepts.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .config import ALayout, Arch, ATile, ConfigError, KernelConfig
from .diskcache import cache_file, load_or_build

MS_CHOICES = (16, 32, 64, 128, 256)
NS_CHOICES = (32, 64, 128, 256, 512)  # 512 halves the A traffic a FLOP of 256
MT_CHOICES = (4, 8, 16)
NT_CHOICES = (4, 8, 16)
WARP_LAYOUTS = ((8, 4), (4, 8), (16, 2), (2, 16), (32, 1), (1, 32))
KS_WINDOWS = (1, 2, 4, 8)  # KS = m·windows
STAGE_CHOICES = (1, 2, 3)
SPLIT_K_CHOICES = (1, 2, 3, 4)
# The share of random configurations drawn with the stream-K grid (split and slice 1 only).
STREAM_K_SHARE = 0.25
SLICE_K_CHOICES = (1, 2, 4)  # sliced K: more warps a block where tiles are few (small M)
# The share of random sm_90 configurations drawn with the bulk copy engine (tma).
TMA_SHARE = 0.5


# The core benchmark's best hand-picked configuration of each pattern and A layout (H100,
# M = N = K = 4096, L = 32; results/core_tma_h100/bench_core.json, a grid of two block
# tiles, KS of 2 or 4 windows, 2 or 3 stages, with and without TMA copies). Unpacked, and
# all with the bulk copy engine's copies (tma): 128x256 blocks of 16x8 thread tiles in
# 8x4 warps, or for 8:32 and 4:32 64x256 blocks of 16x4 tiles in 4x8 warps. Row-major A is
# fastest copied K-major first ("tx"), then the K-major kernel. It is the reference a tuned
# shape must not fall below.
CORE_TILES = {
    "128x256": {"ms": 128, "ns": 256, "mt": 16, "nt": 8, "warp_m": 8, "warp_n": 4},
    "64x256": {"ms": 64, "ns": 256, "mt": 16, "nt": 4, "warp_m": 4, "warp_n": 8},
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


@dataclass(frozen=True)
class Problem:
    """What a configuration must fit: pattern, vector length, A layout, arch."""

    n: int
    m: int
    vec: int
    a_layout: ALayout = ALayout.ROW_MAJOR
    arch: Arch = Arch.SM90


def core_config(problem: Problem) -> KernelConfig | None:
    """The core benchmark's best hand-picked configuration for ``problem``'s pattern and A
    layout; ``None`` for a pattern it did not cover or where the tile does not fit."""
    best = CORE_BEST.get((problem.n, problem.m, problem.a_layout))
    if best is None:
        return None
    tile, windows, stages, a_tile = best
    tma = problem.arch is Arch.SM90
    if not tma:
        tile, windows, stages = CORE_KERNELS_CP_ASYNC[(problem.n, problem.m)]
    return try_config(problem, ks=problem.m * windows, stages=stages, a_tile=a_tile,
                      packing=False, tma=tma, **CORE_TILES[tile])


def ks_choices(m: int) -> list[int]:
    return [m * w for w in KS_WINDOWS if m * w <= 256] or [m]


def tile_choices(problem: Problem) -> tuple[ATile, ...]:
    """M-major A tiles serve row-major A only."""
    return tuple(ATile) if problem.a_layout is ALayout.ROW_MAJOR else (ATile.K_MAJOR,)


def try_config(problem: Problem, **params) -> KernelConfig | None:
    """The configuration, or ``None`` where it breaks a rule."""
    try:
        return KernelConfig(n=problem.n, m=problem.m, vec=problem.vec,
                            a_layout=problem.a_layout, arch=problem.arch, **params)
    except ConfigError:
        return None


def random_config(problem: Problem, rng: random.Random, max_tries: int = 10000,
                  max_threads: int = 1024) -> KernelConfig:
    """A uniformly drawn valid configuration (rejection sampling)."""
    for _ in range(max_tries):
        warp_m, warp_n = rng.choice(WARP_LAYOUTS)
        config = try_config(
            problem,
            ms=rng.choice(MS_CHOICES), ns=rng.choice(NS_CHOICES), ks=rng.choice(ks_choices(
                problem.m)), mt=rng.choice(MT_CHOICES), nt=rng.choice(NT_CHOICES),
            warp_m=warp_m, warp_n=warp_n, packing=rng.random() < 0.5,
            stages=rng.choice(STAGE_CHOICES), split_k=rng.choice(SPLIT_K_CHOICES),
            slice_k=rng.choice(SLICE_K_CHOICES), a_tile=rng.choice(tile_choices(problem)),
            stream_k=rng.random() < STREAM_K_SHARE,
            tma=problem.arch is Arch.SM90 and rng.random() < TMA_SHARE,
        )
        if config is not None and config.threads <= max_threads:
            return config
    raise ConfigError(f"no valid configuration found for {problem}")


@functools.cache
def enumerate_configs(problem: Problem) -> tuple[KernelConfig, ...]:
    """Every valid configuration of the space (split-K 1, every slice_k), in a fixed order.
    Cached in the process and on disk (``enumeration_cache``): building it took 2.8 s for
    the 43,362 of row-major 8:32 on the dev host, reading it back 0.14 s, and every tuning
    worker needs it before its first study."""
    return load_or_build(enumeration_cache(problem), lambda: tuple(_valid_configs(problem)),
                         tuple)


def enumeration_cache(problem: Problem) -> Path:
    """Where ``problem``'s enumeration is kept: it depends on this module, the
    configuration's rules and the format's limits."""
    return cache_file("space", problem, ("space.py", "config.py", "format.py"))


def tma_choices(problem: Problem) -> tuple[bool, ...]:
    """The bulk copy engine is Hopper's (sm_90)."""
    return (False, True) if problem.arch is Arch.SM90 else (False,)


def _valid_configs(problem: Problem) -> Iterator[KernelConfig]:
    grid = itertools.product(MS_CHOICES, NS_CHOICES, ks_choices(problem.m), MT_CHOICES,
                             NT_CHOICES, WARP_LAYOUTS, (False, True), STAGE_CHOICES,
                             tile_choices(problem), SLICE_K_CHOICES, tma_choices(problem))
    for ms, ns, ks, mt, nt, (warp_m, warp_n), packing, stages, a_tile, slice_k, tma in grid:
        if ms % (mt * warp_m) or ns % (nt * warp_n):  # the warps do not tile the block:
            continue  # skipped before KernelConfig (which would refuse it) costs ~30 us
        if tma and (packing or slice_k > 1):  # refused by the TMA rules; skipped sooner
            continue
        config = try_config(problem, ms=ms, ns=ns, ks=ks, mt=mt, nt=nt, warp_m=warp_m,
                            warp_n=warp_n, packing=packing, stages=stages, a_tile=a_tile,
                            slice_k=slice_k, tma=tma)
        if config is not None:
            yield config
