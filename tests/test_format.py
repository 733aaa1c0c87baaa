"""The vector-wise N:M format: pruning, validation, padding, the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import nmgen
from nmgen.format import Pattern

PATTERNS = ["2:4", "1:4", "2:8", "4:8", "4:16", "8:16", "16:32", "12:32", "8:32", "4:32"]


@pytest.fixture
def rng():
    return np.random.default_rng()


def brute_force_keep(dense: np.ndarray, n: int, m: int, vec: int) -> np.ndarray:
    """Mask of kept entries, one (window, group) at a time."""
    k, cols = dense.shape
    mask = np.zeros_like(dense, bool)
    for w0 in range(0, k, m):
        for q0 in range(0, cols, vec):
            block = dense[w0:w0 + m, q0:q0 + vec]
            norms = np.linalg.norm(block.astype(np.float64), axis=1)
            keep = np.argsort(-norms, kind="stable")[:n]
            mask[w0 + keep, q0:q0 + vec] = True
    return mask


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("vec", [1, 8, 32])
def test_prune_keeps_largest_norm_rows(pattern, vec, rng):
    n, m = Pattern.parse(pattern).n, Pattern.parse(pattern).m
    k, cols = m * 3 + 5, vec * 2 + 3  # K and N not multiples of m and L
    dense = rng.standard_normal((k, cols)).astype(np.float32)
    b = nmgen.prune(dense, pattern, vec)
    assert b.shape == (k, cols)
    assert b.values.shape == (-(-k // m) * n, cols)
    assert b.indices.shape == (-(-k // m) * n, -(-cols // vec))
    assert b.indices.dtype == np.uint8
    expected = np.where(brute_force_keep(dense, n, m, vec), dense, 0)
    np.testing.assert_array_equal(b.to_dense(), expected)


def test_layout_nk_takes_a_linear_weight(rng):
    weight = rng.standard_normal((48, 64)).astype(np.float32)  # [out, in]
    x = rng.standard_normal((5, 64))
    b = nmgen.prune(weight, "2:4", 8, layout="nk")
    assert b.shape == (64, 48)
    np.testing.assert_array_equal(b.to_dense(), nmgen.prune(weight.T, "2:4", 8).to_dense())
    np.testing.assert_allclose(nmgen.reference(x, b), x @ b.to_dense().astype(np.float64))


@pytest.mark.parametrize("pattern", PATTERNS)
def test_reference_matches_dense_product(pattern, rng):
    dense = rng.standard_normal((100, 70)).astype(np.float32)
    b = nmgen.prune(dense, pattern, 16)
    a = rng.standard_normal((9, 100))
    np.testing.assert_allclose(nmgen.reference(a, b), a @ b.to_dense().astype(np.float64),
                               rtol=1e-12, atol=1e-12)


def test_padding_is_invisible(rng):
    dense = rng.standard_normal((37, 21)).astype(np.float32)
    b = nmgen.prune(dense, "8:16", 8)  # the last window has 5 real rows but keeps 8
    assert b.to_dense().shape == (37, 21)
    assert b.values.shape[1] == 21
    kept_rows = b.kept_rows()
    assert kept_rows.max() >= 37  # the last window reaches into the padding ...
    a = rng.standard_normal((3, 37))
    assert np.isfinite(nmgen.reference(a, b)).all()  # ... which never shows in a product


def test_from_compressed_round_trip_and_validation(rng):
    b = nmgen.prune(rng.standard_normal((64, 40)), "2:8", 8)
    again = nmgen.NMMatrix.from_compressed(b.values, b.indices, "2:8", 8, (64, 40))
    np.testing.assert_array_equal(again.to_dense(), b.to_dense())
    bad = b.indices.copy()
    bad[0, 0] = 8
    with pytest.raises(ValueError, match="out of range"):
        nmgen.NMMatrix.from_compressed(b.values, bad, "2:8", 8, (64, 40))
    bad = b.indices.copy()
    bad[1, 0] = bad[0, 0]
    with pytest.raises(ValueError, match="ascending"):
        nmgen.NMMatrix.from_compressed(b.values, bad, "2:8", 8, (64, 40))
    with pytest.raises(ValueError, match="values has shape"):
        nmgen.NMMatrix.from_compressed(b.values[:, :39], b.indices, "2:8", 8, (64, 40))
    with pytest.raises(ValueError, match="indices has shape"):
        nmgen.NMMatrix.from_compressed(b.values, b.indices[:, :4], "2:8", 8, (64, 40))


def test_values_are_read_only(rng):
    b = nmgen.prune(rng.standard_normal((16, 16)), "2:4", 8)
    with pytest.raises(ValueError):
        b.values[0, 0] = 1.0


@pytest.mark.parametrize("bad", ["2-4", "5:4", "0:4", "1:300", (1, 2, 3)])
def test_bad_patterns_are_named(bad):
    with pytest.raises((ValueError, TypeError), match="pattern"):
        Pattern.parse(bad)


def test_bad_weight_and_layout():
    with pytest.raises(ValueError, match="2-D"):
        nmgen.prune(np.ones(8), "2:4", 8)
    with pytest.raises(ValueError, match="layout"):
        nmgen.prune(np.ones((8, 8)), "2:4", 8, layout="mk")
    with pytest.raises(ValueError, match="vec"):
        nmgen.prune(np.ones((8, 8)), "2:4", 0)
