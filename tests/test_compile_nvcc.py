"""nvcc compiles every variant of every family for sm_80 and sm_90: no spills, at most 255
registers, shared memory as KernelConfig computes it (a static_assert in the source ties
the template's layout to ``smem_bytes``). Required in CI (NMGEN_REQUIRE_NVCC=1)."""

from __future__ import annotations

import itertools
import random

import pytest

import nmgen
from nmgen.bench.selftest import fuzz_arch
from nmgen.compiler.nvcc import compile_with_nvcc, parse_ptxas_report
from nmgen.families.f32_simt.config import ATile
from nmgen.families.f32_simt.model import min_blocks_per_sm, register_budget
from nmgen.families.f32_simt.space import SPACE
from nmgen.families.registry import all_families
from nmgen.families.space import ConfigError
from nmgen.gpus import Arch
from nmgen.problem import ALayout, Problem

pytestmark = pytest.mark.nvcc

# Every template branch: A layout and tile x packing x pipeline depth x split-K, on both
# arches.
LAYOUTS = [(ALayout.ROW_MAJOR, ATile.K_MAJOR), (ALayout.ROW_MAJOR, ATile.M_MAJOR),
           (ALayout.ROW_MAJOR, ATile.K_MAJOR_STAGED), (ALayout.ROW_MAJOR, ATile.K_MAJOR_COPY),
           (ALayout.K_MAJOR, ATile.K_MAJOR)]
VARIANTS = [v for v in itertools.product(LAYOUTS, (False, True), (1, 2, 3), (1, 3),
                                         (Arch.SM80, Arch.SM90))
            if not (v[0][1] is ATile.K_MAJOR_STAGED and v[1])]  # staged: unpacked only


STAGED_SHORTFALL = 32  # registers the staged kernels' estimate may fall short by (see below)
SMALL_SPILL = 128  # bytes a known-defect kernel may spill each way (see below)
STREAM_K_SHORTFALL = 48  # registers the stream-K kernels' estimate may fall short by


def variant_config(layout_tile, packing, stages, split_k, arch, seed) -> nmgen.KernelConfig:
    layout, a_tile = layout_tile
    rng = random.Random(seed)
    while True:
        problem = Problem(*rng.choice([(2, 4), (8, 32), (4, 16), (3, 7), (16, 64)]),
                          rng.choice([4, 8, 32, 128]), a_layout=layout, arch=arch)
        try:
            config = SPACE.sample(problem, rng)
            if config.threads > 512:
                continue
            return config.replace(packing=packing, stages=stages, split_k=split_k,
                                  a_tile=a_tile.value)
        except ConfigError:  # e.g. more stages no longer fit in shared memory
            continue


def _variant_id(v) -> str:
    if isinstance(v, tuple):
        return "-".join(x.value for x in v)
    return getattr(v, "value", str(v))


# Sliced K on every A tile that takes it, with a random rest, on both arches.
SLICED_VARIANTS = [(lt, s, arch) for lt in LAYOUTS if lt[1] is not ATile.K_MAJOR_STAGED
                   for s in (2, 4) for arch in (Arch.SM80, Arch.SM90)]


@pytest.mark.parametrize("layout_tile, packing, stages, split_k, arch", VARIANTS,
                         ids=_variant_id)
def test_variant_compiles_within_resources(layout_tile, packing, stages, split_k, arch):
    config = variant_config(layout_tile, packing, stages, split_k, arch,
                            seed=random.randrange(1 << 30))
    check_resources(config)


@pytest.mark.parametrize("layout_tile, slice_k, arch", SLICED_VARIANTS, ids=_variant_id)
def test_sliced_variant_compiles_within_resources(layout_tile, slice_k, arch):
    rng = random.Random(random.randrange(1 << 30))
    while True:
        config = variant_config(layout_tile, rng.random() < 0.5, rng.choice((1, 2, 3)),
                                rng.choice((1, 3)), arch, seed=rng.randrange(1 << 30))
        try:
            config = config.replace(slice_k=slice_k)
            break
        except ConfigError:  # rows a stage not a multiple of the slices, or too many threads
            continue
    check_resources(config)


# Stream-K on every A tile, with a random rest, on both arches; and the core benchmark's
# 16x8 tiles, whose data-parallel kernels already use 248 of the 255 registers.
STREAM_K_VARIANTS = [(lt, arch) for lt in ((ALayout.K_MAJOR, ATile.K_MAJOR),
                                           (ALayout.ROW_MAJOR, ATile.K_MAJOR_COPY))
                     for arch in (Arch.SM80, Arch.SM90)]
STREAM_K_CORE = ["nm_spmm_f32_n16m32l32_ms128ns256ks64_mt16nt8_w8x4_nopack_s2_k1_streamk_km_sm90",
                 "nm_spmm_f32_n4m32l32_ms128ns256ks128_mt16nt8_w8x4_nopack_s2_k1_streamk_rm_tx_sm90"]


@pytest.mark.parametrize("layout_tile, arch", STREAM_K_VARIANTS, ids=_variant_id)
def test_stream_k_variant_compiles_within_resources(layout_tile, arch):
    rng = random.Random(random.randrange(1 << 30))
    while True:
        config = variant_config(layout_tile, rng.random() < 0.5, rng.choice((1, 2, 3)), 1,
                                arch, seed=rng.randrange(1 << 30))
        try:
            config = config.replace(stream_k=True, slice_k=1)
            break
        except ConfigError:  # e.g. the walk's state no longer fits in shared memory
            continue
    check_resources(config)


@pytest.mark.parametrize("name", STREAM_K_CORE)
def test_stream_k_core_tiles_compile_without_spills(name):
    config = nmgen.KernelConfig.from_name(name)
    check_resources(config)
    main = compile_with_nvcc(nmgen.render(config)).resources[config.name]
    assert main.spill_stores == 0 and main.spill_loads == 0, f"{name}: {main}"


# The bulk copy engine (sm_90): K-major and copied A, both pipeline depths it takes, with
# and without split-K; and the core benchmark's TMA kernels.
TMA_VARIANTS = list(itertools.product(((ALayout.K_MAJOR, ATile.K_MAJOR),
                                       (ALayout.ROW_MAJOR, ATile.K_MAJOR_COPY)), (2, 3), (1, 3)))
TMA_CORE = ["nm_spmm_f32_n16m32l32_ms128ns256ks64_mt16nt8_w8x4_nopack_s3_k1_km_tma_sm90",
            "nm_spmm_f32_n12m32l32_ms128ns256ks64_mt16nt8_w8x4_nopack_s3_k1_rm_tx_tma_sm90",
            "nm_spmm_f32_n4m32l32_ms128ns256ks128_mt16nt8_w8x4_nopack_s2_k1_km_tma_sm90",
            # uint16 table (KernelConfig.table_bytes): int32 would leave no room for barriers
            "nm_spmm_f32_n12m32l32_ms128ns256ks128_mt16nt8_w8x4_nopack_s2_k1_km_tma_sm90"]


@pytest.mark.parametrize("layout_tile, stages, split_k", TMA_VARIANTS, ids=_variant_id)
def test_tma_variant_compiles_within_resources(layout_tile, stages, split_k):
    rng = random.Random(random.randrange(1 << 30))
    while True:
        config = variant_config(layout_tile, False, stages, split_k, Arch.SM90,
                                seed=rng.randrange(1 << 30))
        try:
            config = config.replace(tma=True, slice_k=1, stream_k=False)
            break
        except ConfigError:  # e.g. a box side past 256, or a table of odd length
            continue
    check_resources(config)
    assert "cp.async.bulk.tensor.2d" in nmgen.render(config).code


@pytest.mark.parametrize("name", TMA_CORE)
def test_tma_core_tiles_compile_without_spills(name):
    config = nmgen.KernelConfig.from_name(name)
    check_resources(config)
    main = compile_with_nvcc(nmgen.render(config)).resources[config.name]
    assert main.spill_stores == 0 and main.spill_loads == 0, f"{name}: {main}"


def check_resources(config: nmgen.KernelConfig) -> None:
    """nvcc builds every entry point of ``config`` without spills (but the known small
    ones), within 255 registers and the register file, with only dynamic shared memory."""
    compiled = compile_with_nvcc(nmgen.render(config))
    assert set(compiled.resources) == set(nmgen.render(config).entry_points), compiled.log
    # ptxas allocates registers 8 at a time: a launch bound of 85 a thread caps it at 80.
    budget = register_budget(config) // 8 * 8
    main = compiled.resources[config.name]
    for entry, res in compiled.resources.items():
        if entry == config.name and (config.registers_estimate >= budget or (
                config.staged and config.registers_estimate + STAGED_SHORTFALL >= budget) or (
                config.stream_k and config.registers_estimate + STREAM_K_SHORTFALL >= budget)
                or res.registers >= budget):
            # KNOWN DEFECTS: 8x8 thread tiles whose register
            # budget is exactly the estimate (128) spill a few bytes in about 1 of 8
            # configurations. They are the fastest kernels measured, so the model keeps
            # them; the spill must stay small until the template needs fewer registers.
            # The serpentine FFMA order made it larger on odd shapes
            # of tile: 64 / 120 bytes stored / loaded (CI, 2026-11-23:
            # n3m7l128_ms16ns256ks56_mt8nt8_w1x32_nopack_s3_k1_sk4_rm_tm_sm90; 28 / 56
            # before), 40 / 72 in 1 of 520 random 8x8 configurations compiled here, none
            # in the 36 shipped 8x8 winners.
            # Staged ("tr") kernels: the estimate runs up to ~28 registers below what
            # ptxas uses unbounded (a sample of 45), and one whose budget
            # was 12 above the estimate spilled 48 bytes (CI, 2026-11-23:
            # n4m16l32_ms128ns32ks64_mt8nt4_w16x2_nopack_s1_k1_rm_tr_sm80). Recalibrating
            # the estimate changes launch bounds, so it waits for a GPU run.
            # Stream-K kernels near the cap: the persistent loop needs
            # up to ~48 registers beyond the estimate on some 16x8 tiles, which spilled
            # 8-48 bytes at 254-255 registers in 4 of ~150 random ones compiled here
            # (n2m4l32_ms16ns512ks8_mt16nt8_w1x32_nopack_s3_k1_streamk_km_sm90: 8 / 48).
            # The core benchmark's 16x8 stream-K kernels do not spill
            # (test_stream_k_core_tiles_compile_without_spills).
            # Any kernel that ptxas capped at its launch bound, where the estimate fell
            # short: 4 / 4 bytes at 168 registers, estimate 160 (CI, 2026-11-27:
            # n4m16l8_ms128ns64ks32_mt4nt16_w8x4_nopack_s1_k1_rm_sm80).
            assert res.spill_stores <= SMALL_SPILL and res.spill_loads <= SMALL_SPILL, \
                f"{entry}: {res}"
        else:
            assert res.spill_stores == 0 and res.spill_loads == 0, f"{entry} spills: {res}"
        assert res.registers <= 255
    assert main.static_smem == 0  # all its shared memory is the dynamic smem_bytes
    assert main.registers * config.threads <= 65536, f"{config.name}: {main}"


@pytest.mark.parametrize("family", all_families(), ids=lambda f: f.name)
@pytest.mark.parametrize("seed", range(3))
def test_every_family_compiles(family, seed):
    """A new family without a template, or with one that does not build, fails here:
    sampled configurations of each registered family, every entry point."""
    dtype = sorted(family.dtypes, key=lambda d: d.value)[0]
    arch = fuzz_arch(family, Arch.SM90)  # sm_90, else the newest it serves (mmasp: sm_89)
    problem = next(p for p in (Problem(2, 4, 8, arch=arch, dtype=dtype),  # the first it serves
                               Problem(2, 4, 64, ALayout.K_MAJOR, arch, dtype))
                   if family.serves(p) is None)
    config = family.space.sample(problem, random.Random(seed))
    compiled = compile_with_nvcc(nmgen.render(config))
    assert set(family.entry_points(config)) <= set(compiled.resources), compiled.log


def test_ptx_output():
    compiled = compile_with_nvcc(nmgen.render(nmgen.KernelConfig(2, 4, 8, 64, 64, 16, 4, 4)),
                                 output="ptx")
    assert ".entry" in compiled.path.read_text()


def test_ptxas_report_parser():
    log = ("ptxas info    : Compiling entry function 'k1' for 'sm_90'\n"
           "ptxas info    : Function properties for k1\n"
           "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 99 registers, used 1 barriers, 256 bytes smem\n")
    res = parse_ptxas_report(log)["k1"]
    assert (res.registers, res.spill_stores, res.spill_loads, res.stack_bytes,
            res.static_smem) == (99, 4, 12, 8, 256)


def test_landing_kernels_that_spilled_get_their_registers_or_are_refused():
    """Two landing kernels that spilled under the old register estimate: one now gets a
    launch bound with room (no spill), the other needs more than 255 and is refused."""
    roomy = nmgen.KernelConfig(8, 32, 32, 256, 64, 32, 8, 8, warp_m=8, warp_n=4, stages=2,
                               a_layout=ALayout.ROW_MAJOR, a_tile="tk")
    assert min_blocks_per_sm(roomy) == 1
    res = compile_with_nvcc(nmgen.render(roomy)).resources[roomy.name]
    assert res.spill_stores == 0 and res.spill_loads == 0, f"{roomy.name}: {res}"
    with pytest.raises(ConfigError, match="registers"):
        nmgen.KernelConfig(16, 64, 32, 128, 64, 64, 8, 16, warp_m=16, warp_n=2, stages=1,
                           split_k=3, a_layout=ALayout.ROW_MAJOR, a_tile="tk",
                           arch=Arch.SM80)
