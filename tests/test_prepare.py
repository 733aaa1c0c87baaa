"""The kernel-side layout, checked by emulating the kernel's arithmetic in NumPy."""

from __future__ import annotations

import random

import numpy as np
import pytest

import nmgen
from nmgen.families.f32_simt import F32_SIMT
from nmgen.families.f32_simt.prepare import prepare as prepare_layout
from nmgen.problem import Problem


def emulate_kernel(a: np.ndarray, b: nmgen.NMMatrix, config: nmgen.KernelConfig) -> np.ndarray:
    """What the generated kernel computes, from the prepared tables alone."""
    tables = F32_SIMT.prepare(b, config).arrays  # what the runtime uploads
    values, pos, rows = tables["values"], tables["pos"], tables["rows"]
    k_dense, cols = b.shape
    nb, stages, groups, ws = pos.shape
    out = np.zeros((a.shape[0], values.shape[1]))
    for col_block in range(nb):
        for t in range(stages):
            # packing: the table's rows (-1: zero-filled); else the stage's KS rows
            tile_k = (rows[col_block, t] if config.packing
                      else t * config.ks + np.arange(config.ks))
            valid = (tile_k >= 0) & (tile_k < k_dense)
            tile = np.where(valid[None, :], a[:, np.clip(tile_k, 0, k_dense - 1)], 0.0)
            for g in range(groups):
                if config.ns >= config.vec:
                    col0 = col_block * config.ns + g * config.vec
                    width = config.vec
                else:
                    col0, width = col_block * config.ns, config.ns
                for w in range(ws):
                    brow = values[t * ws + w, col0:col0 + width]
                    out[:, col0:col0 + width] += np.outer(tile[:, pos[col_block, t, g, w]], brow)
    return out[:, :cols]


@pytest.mark.parametrize("seed", range(12))
def test_prepared_tables_reproduce_the_product(seed):
    rng = random.Random(seed)
    n, m = rng.choice([(2, 4), (1, 4), (4, 16), (12, 32), (3, 7)])
    config = F32_SIMT.space.sample(Problem(n, m, rng.choice([4, 8, 16, 32, 64])), rng)
    data = np.random.default_rng(seed)
    k, cols = rng.randint(1, 150), rng.randint(1, 150)
    b = nmgen.prune(data.standard_normal((k, cols)), (n, m), config.vec)
    a = data.standard_normal((3, k))
    np.testing.assert_allclose(emulate_kernel(a, b, config), nmgen.reference(a, b),
                               rtol=1e-9, atol=1e-9)


def test_narrow_table_holds_the_same_rows_as_uint16():
    """A TMA kernel with uint16 table entries (KernelConfig.table_bytes) gets the same
    layout, its table as uint16, and still reproduces the product."""
    rng = np.random.default_rng()
    b = nmgen.prune(rng.standard_normal((300, 260)), "12:32", 32)
    narrow = nmgen.KernelConfig(12, 32, 32, 128, 256, 128, 16, 8, stages=2, a_layout="km",
                                tma=True)
    wide = narrow.replace(tma=False)
    got, want = prepare_layout(b, narrow), prepare_layout(b, wide)
    assert got.arrays["pos"].dtype == np.uint16 and want.arrays["pos"].dtype == np.int32
    assert got.key != want.key and np.array_equal(got.arrays["pos"], want.arrays["pos"])
    a = rng.standard_normal((3, 300))
    np.testing.assert_allclose(emulate_kernel(a, b, narrow), nmgen.reference(a, b),
                               rtol=1e-9, atol=1e-9)


def test_packing_loads_fewer_rows_and_reports_its_cost():
    b = nmgen.prune(np.random.default_rng(0).standard_normal((512, 256)), "4:32", 32)
    config = nmgen.KernelConfig(4, 32, 32, 64, 128, 128, 8, 8, warp_m=4, warp_n=8,
                                packing=True)
    layout = prepare_layout(b, config)
    rows = layout.arrays["rows"]
    assert rows.shape[-1] == config.a_rows == 64  # 4 groups x 16 rows < KS = 128
    live = (rows >= 0).sum(axis=-1)
    assert live.max() <= 64 and live.mean() < 64  # groups share some rows
    assert layout.seconds > 0 and layout.nbytes > 0


def test_layout_rejects_a_mismatched_weight():
    b = nmgen.prune(np.ones((64, 64)), "2:4", 8)
    with pytest.raises(ValueError, match="is for 4:8"):
        prepare_layout(b, nmgen.KernelConfig(4, 8, 8, 64, 64, 32, 4, 4))


def test_random_weight_for_tuning_is_a_valid_nm_matrix():
    from nmgen.runtime.check import random_weight

    rng = np.random.default_rng()
    b = random_weight(rng, 3, 7, 8, 50, 30)
    assert b.shape == (50, 30) and (b.n, b.m, b.vec) == (3, 7, 8)
    a = rng.standard_normal((4, 50))
    np.testing.assert_allclose(nmgen.reference(a, b), a @ b.to_dense().astype(np.float64),
                               rtol=1e-9, atol=1e-9)
