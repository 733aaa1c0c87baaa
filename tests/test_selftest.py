"""``nmgen selftest``'s host side: what it draws and how it shrinks a failure (the GPU
runs are tests/test_selftest_gpu.py)."""

from __future__ import annotations

import random

import pytest

from nmgen.bench.selftest import Case, draw_config, draw_shapes, shrink
from nmgen.families.f32_simt import F32_SIMT
from nmgen.gpus import Arch, gpu_spec


def test_draws_valid_configurations_that_fit_the_gpu_and_cover_the_paths():
    rng = random.Random(0)
    configs = [draw_config(F32_SIMT, rng, Arch.SM90, gpu_spec("h100")) for _ in range(300)]
    assert all(F32_SIMT.feasible(c, gpu_spec("h100")) is None for c in configs)
    seen = {"split_k": any(c.split_k > 1 for c in configs),
            "slice_k": any(c.slice_k > 1 for c in configs),
            "stream_k": any(c.stream_k for c in configs), "tma": any(c.tma for c in configs),
            "packing": any(c.packing for c in configs), "L=1": any(c.vec == 1 for c in configs)}
    assert all(seen.values()), seen
    assert {c.a_tile.value for c in configs} == {"tk", "tm", "tr", "tx"}


def test_shapes_start_at_the_m_edges_and_stay_in_bounds():
    shapes = list(draw_shapes(random.Random(1), 20, 100))
    assert [s[0] for s in shapes[:6]] == [1, 2, 3, 17, 64, 255]
    assert all(1 <= s[1] <= 100 and 1 <= s[2] <= 100 for s in shapes)


def test_a_failure_shrinks_to_a_minimal_case():
    case = Case("k", 300, 257, 129, 3, 7)
    minimal = shrink(case, lambda c: c.cols > 40 and c.depth > 8)  # fails while both big
    assert (minimal.rows, minimal.cols, minimal.depth) == (1, 64, 16)
    assert (minimal.config, minimal.lda_pad, minimal.seed) == ("k", 3, 7)


def test_about_half_the_draws_carry_an_epilogue_of_each_kind():
    from nmgen.bench.selftest import fuzz_arch
    from nmgen.families.registry import all_families

    rng = random.Random(2)
    for family in all_families():
        arch = fuzz_arch(family, Arch.SM90)
        configs = [draw_config(family, rng, arch, gpu_spec("h100")) for _ in range(200)]
        tags = {c.epilogue.tag for c in configs}
        assert 60 < sum(bool(c.epilogue) for c in configs) < 140, family.name
        assert len(tags) == 10, (family.name, tags)  # none and the nine epilogues


def test_a_family_of_one_arch_draws_nothing_on_another():
    from nmgen.bench.selftest import serves_any
    from nmgen.families.wgmma import WGMMA

    assert serves_any(WGMMA, Arch.SM90) and serves_any(F32_SIMT, Arch.SM80)
    assert not serves_any(WGMMA, Arch.SM80)
    rng = random.Random(3)
    configs = [draw_config(WGMMA, rng, Arch.SM90, gpu_spec("h100")) for _ in range(50)]
    assert {c.vec for c in configs} <= {64, 128} and len({c.n for c in configs}) > 2


def test_a_family_of_older_archs_is_fuzzed_at_the_newest_one_it_serves():
    """mmasp leaves sm_90 to sptc, yet its kernels run on an H200: the fuzz draws them for
    sm_89 there; a family serving the GPU's arch is drawn for it; one newer than the GPU's,
    never."""
    from nmgen.bench.selftest import fuzz_arch
    from nmgen.families.gemv import GEMV
    from nmgen.families.mmasp import MMASP
    from nmgen.families.sptc import SPTC

    assert fuzz_arch(MMASP, Arch.SM90) is Arch.SM89
    assert fuzz_arch(MMASP, Arch.SM80) is Arch.SM80
    assert fuzz_arch(SPTC, Arch.SM90) is Arch.SM90 and fuzz_arch(SPTC, Arch.SM89) is None
    assert fuzz_arch(GEMV, Arch.SM90) is Arch.SM90
    rng = random.Random(5)
    configs = [draw_config(MMASP, rng, Arch.SM89, gpu_spec("h200")) for _ in range(20)]
    assert {c.arch for c in configs} == {Arch.SM89}
    with pytest.raises(ValueError, match="serves no problem on sm_80"):
        draw_config(SPTC, rng, Arch.SM80, gpu_spec("h100"))
