"""KernelConfig: validation names the rule; names and JSON round-trip."""

from __future__ import annotations

import random

import pytest

import nmgen
from nmgen.families.f32_simt.config import KernelConfig
from nmgen.families.f32_simt.space import SPACE
from nmgen.families.space import ConfigError
from nmgen.gpus import Arch
from nmgen.problem import ALayout, Problem

BASE = dict(n=8, m=32, vec=32, ms=128, ns=128, ks=32, mt=8, nt=8)


def test_name_states_every_parameter():
    config = KernelConfig(**BASE, packing=True, stages=3, split_k=2, a_layout="km",
                          arch="sm_80")
    assert config.name == "nm_spmm_f32_n8m32l32_ms128ns128ks32_mt8nt8_w8x4_pack_s3_k2_km_sm80"
    assert KernelConfig.from_name(config.name) == config
    m_major = config.replace(a_layout="rm", a_tile="tm")
    assert m_major.name.endswith("_k2_rm_tm_sm80")
    assert KernelConfig.from_name(m_major.name) == m_major


def test_sliced_k_is_named_and_sized():
    sliced = KernelConfig(**BASE, slice_k=2, a_layout="km")
    assert sliced.name == "nm_spmm_f32_n8m32l32_ms128ns128ks32_mt8nt8_w8x4_nopack_s2_k1_sk2_km_sm90"
    assert KernelConfig.from_name(sliced.name) == sliced
    assert KernelConfig.from_json(sliced.to_json()) == sliced
    assert sliced.threads == 2 * sliced.slice_threads == 2 * 256
    # The slices meet in a shared MS x NS tile, larger here than the pipeline's buffers.
    assert sliced.smem_bytes == 4 * 128 * 128 > 4 * 2 * sum(sliced.stage_words)


def test_stream_k_is_named_and_sized():
    streamed = KernelConfig(**BASE, stream_k=True, a_layout="km")
    assert streamed.name == ("nm_spmm_f32_n8m32l32_ms128ns128ks32_mt8nt8_w8x4_nopack_s2_k1"
                             "_streamk_km_sm90")
    assert KernelConfig.from_name(streamed.name) == streamed
    assert KernelConfig.from_json(streamed.to_json()) == streamed
    # Its walk's state (four words) lies past the pipeline's buffers.
    assert streamed.smem_bytes == streamed.replace(stream_k=False).smem_bytes + 16
    assert "stream_k" not in KernelConfig(**BASE).to_dict()  # older kernels unchanged


def test_tma_is_named_and_sized():
    """The bulk copy engine's kernels: ``_tma`` after the A layout and tile; every stage
    buffer 128-byte aligned (the table padded), the mbarriers past the pipeline."""
    config = KernelConfig(**{**BASE, "ns": 256, "ks": 64}, stages=3, a_layout="km", tma=True)
    assert config.name.endswith("_s3_k1_km_tma_sm90")
    assert KernelConfig.from_name(config.name) == config
    assert KernelConfig.from_json(config.to_json()) == config
    assert sum(config.stage_words) % 32 == 0 and config.stage_words[0] % 32 == 0
    plain = config.replace(tma=False)
    assert config.smem_bytes == plain.smem_bytes + 3 * 4 * (config.pos_words - plain.pos_words) + 32
    assert "tma" not in plain.to_dict()  # older kernels unchanged
    copied = config.replace(a_layout="rm", a_tile="tx")
    assert copied.name.endswith("_rm_tx_tma_sm90") and KernelConfig.from_name(copied.name) == copied


def test_tma_table_is_narrowed_only_where_int32_leaves_no_room():
    """12:32 at 128x256, KS 128, 2 stages: int32 tiles and tables fill the 227 KB, so the
    TMA kernel keeps uint16 entries (room for its mbarriers); its cp.async twin and every
    kernel that fits keep int32."""
    wide = KernelConfig(12, 32, 32, 128, 256, 128, 16, 8, stages=2, a_layout="km")
    assert wide.smem_bytes == Arch.SM90.max_smem_per_block and wide.table_bytes == 4
    narrow = wide.replace(tma=True)
    assert narrow.table_bytes == 2 and narrow.smem_bytes <= Arch.SM90.max_smem_per_block
    assert narrow.pos_words * 4 >= 2 * narrow.block_groups * narrow.ws
    assert sum(narrow.stage_words) % 32 == 0  # stages still 128-byte aligned
    assert "unsigned short* __restrict__ POS" in nmgen.render(narrow).code
    fits = KernelConfig(12, 32, 32, 128, 256, 64, 16, 8, stages=3, a_layout="km", tma=True)
    assert fits.table_bytes == 4 and "unsigned short" not in nmgen.render(fits).code


def test_cp_async_twin_keeps_fewer_stages_where_its_int32_table_does_not_fit():
    """L = 1 at 32x256, KS 128, 3 stages fits with the TMA path's uint16 table but not with
    the cp.async twin's int32 one (found by the random GPU test: a K-major A of odd M,
    which the engine cannot address, raised ConfigError instead of running)."""
    tma = KernelConfig.from_name(
        "nm_spmm_f32_n16m64l1_ms32ns256ks128_mt4nt4_w2x16_nopack_s3_k1_km_tma_sm90")
    with pytest.raises(ConfigError, match="shared memory"):
        tma.replace(tma=False)
    twin = tma.cp_async_twin()
    assert not twin.tma and twin.stages == 2 and twin.replace(stages=2, tma=True) != tma
    assert twin.smem_bytes <= Arch.SM90.max_smem_per_block
    same = KernelConfig(**{**BASE, "a_layout": "km", "tma": True})
    assert same.cp_async_twin() == same.replace(tma=False)  # fits: the same stages


def test_every_sampled_tma_configuration_has_a_cp_async_twin():
    rng = random.Random(3)
    sampled = 0
    for _ in range(1500):
        n, m = rng.choice([(2, 4), (16, 32), (12, 32), (8, 32), (4, 32), (16, 64)])
        config = SPACE.sample(Problem(n, m, rng.choice([1, 8, 32]), a_layout=ALayout.K_MAJOR,
                                      arch=Arch.SM90), rng)
        if config is not None and config.tma:
            twin = config.cp_async_twin()
            assert not twin.tma and twin.replace(stages=config.stages, tma=True) == config
            sampled += 1
    assert sampled > 100


@pytest.mark.parametrize("change, rule", [
    (dict(arch="sm_80"), "TMA copies (tma) need sm_90"),
    (dict(packing=True), "TMA copies (tma) without packing"),
    (dict(a_layout="rm"), "only where the kernel reads K-major A"),
    (dict(a_layout="rm", a_tile="tm"), "only where the kernel reads K-major A"),
    (dict(stages=1), "2 or more stages"),
    (dict(stream_k=True), "not with stream-K or sliced K"),
    (dict(slice_k=2), "not with stream-K or sliced K"),
    (dict(ns=512, nt=16), "box sides"),
    (dict(n=1, ns=64), "16-byte chunks"),
])
def test_tma_rules_name_what_they_need(change, rule):
    with pytest.raises(ConfigError, match=rule.replace("(", r"\(").replace(")", r"\)")):
        KernelConfig(**{**BASE, "a_layout": "km", "tma": True, **change})


def test_parameters_added_later_are_left_out_at_their_default():
    """An unsliced kernel states no slice_k: its name, stored parameters and generated
    header are what they were before sliced K existed (its records carry over)."""
    config = KernelConfig(**BASE)
    assert "slice_k" not in config.to_dict() and "_sk" not in config.name
    assert KernelConfig.from_dict(config.to_dict()).slice_k == 1
    assert config.replace(slice_k=2).to_dict()["slice_k"] == 2


@pytest.mark.parametrize("seed", range(20))
def test_json_and_name_round_trip(seed):
    rng = random.Random(seed)
    problem = Problem(*rng.choice([(2, 4), (16, 32), (4, 8), (3, 7)]), rng.choice([8, 32, 128]),
                      a_layout=rng.choice(list(ALayout)), arch=rng.choice(list(Arch)))
    config = SPACE.sample(problem, rng)
    assert KernelConfig.from_json(config.to_json()) == config
    assert KernelConfig.from_name(config.name) == config


@pytest.mark.parametrize("change, rule", [
    (dict(ks=48), "KS % m == 0"),
    (dict(n=40), "1 <= n <= m"),
    (dict(vec=48), "NS % L == 0 or L % NS == 0"),
    (dict(mt=6), "MT % 4 == 0"),
    (dict(warp_m=4), "warp_m * warp_n == 32"),
    (dict(ms=96), "MS % (MT * warp_m) == 0"),
    (dict(ns=64, warp_n=16, warp_m=2), "NS % (NT * warp_n) == 0"),
    (dict(stages=4), "1 <= stages <= 3"),
    (dict(ms=256, ns=256, mt=4, nt=4), "threads"),
    (dict(ks=256, ms=256, stages=3, a_tile="tm"), "shared memory"),
    (dict(split_k=0), "all sizes >= 1"),
    (dict(a_layout="km", a_tile="tm"), "M-major, staged and copied A tiles"),
    (dict(a_layout="km", a_tile="tx"), "need row-major A"),
    (dict(a_layout="km", a_tile="tr"), "need row-major A"),
    (dict(a_tile="tr", packing=True), "staged A tile (tr) without packing"),
    (dict(a_tile="tr", mt=8, warp_m=4, warp_n=8), "needs the swizzled tile"),
    (dict(ks=32, slice_k=3), "WS % slice_k == 0"),
    (dict(ms=32, ns=32, mt=4, nt=4, ks=512, slice_k=16), "slice_k <= 8"),
    (dict(ms=64, ns=64, ks=64, a_tile="tr", slice_k=2), "not with the staged A tile"),
    (dict(stream_k=True, split_k=2), "stream-K"),
    (dict(stream_k=True, slice_k=2), "not with split-K or sliced K"),
    (dict(stream_k=True, a_tile="tm"), "stream_k) only where the kernel reads K-major A"),
])
def test_violations_name_the_rule(change, rule):
    with pytest.raises(ConfigError, match="rule '.*" + rule.replace("(", r"\(").replace(
            ")", r"\)").replace("*", r"\*")):
        KernelConfig(**{**BASE, **change})


def test_bad_enum_values_are_named():
    with pytest.raises(ConfigError, match="a_layout"):
        KernelConfig(**BASE, a_layout="col")
    with pytest.raises(ConfigError, match="arch"):
        KernelConfig(**BASE, arch="sm_70")
    with pytest.raises(ConfigError, match="unknown configuration keys"):
        KernelConfig.from_dict({**BASE, "tile": 3})


def test_shared_memory_follows_the_design_formula():
    config = KernelConfig(**BASE, stages=2, a_layout="km")
    a_tile, b_tile, index = 4 * 128 * 32, 4 * 8 * 128, 4 * 4 * 8
    assert config.smem_bytes == 2 * (a_tile + b_tile + index)
    packed = KernelConfig(**{**BASE, "ks": 128}, stages=2, a_layout="km", packing=True)
    assert packed.a_rows == min(128, packed.ws * 4)
