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


# ------------------------------------------------------------------ silent data handling
# Each of these encodes a rule of issue "Trust", item 4: data that today is silently
# dropped, truncated or reinterpreted is refused with an error naming the problem.


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_prune_refuses_non_finite_weights(bad, rng):
    dense = rng.standard_normal((16, 8)).astype(np.float32)
    dense[[1, 5, 9], [0, 3, 7]] = bad
    with pytest.raises(ValueError, match=r"weight holds 3 non-finite values \(NaN or inf\)"):
        nmgen.prune(dense, "2:4", 8)
    with pytest.raises(ValueError, match="3 non-finite"):
        nmgen.prune(dense.T, "2:4", 8, layout="nk")


def test_prune_refuses_nan_even_where_it_would_have_been_pruned():
    dense = np.ones((4, 1), np.float32)  # today the NaN row loses to the ones, silently
    dense[3, 0] = np.nan
    with pytest.raises(ValueError, match="1 non-finite"):
        nmgen.prune(dense, "2:4", 1)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_prune_refuses_values_that_overflow_the_target_dtype(dtype):
    dense = np.ones((8, 8))
    dense[0, 0] = 1e39  # finite in float64, inf in float16 and beyond bfloat16's range
    with pytest.raises(ValueError, match=r"1 value.* beyond the range of"):
        nmgen.prune(dense, "2:4", 8, dtype=dtype)


def test_from_compressed_refuses_non_finite_values(rng):
    b = nmgen.prune(rng.standard_normal((64, 40)), "2:8", 8)
    values = np.array(b.values)
    values[0, 0], values[3, 7] = np.nan, -np.inf
    with pytest.raises(ValueError, match=r"values holds 2 non-finite values \(NaN or inf\)"):
        nmgen.NMMatrix.from_compressed(values, b.indices, "2:8", 8, (64, 40))


def test_complex_and_non_numeric_weights_are_refused(rng):
    dense = rng.standard_normal((8, 8)) + 1j
    with pytest.raises(TypeError, match="complex"):
        nmgen.prune(dense, "2:4", 8)
    b = nmgen.prune(dense.real, "2:4", 8)
    with pytest.raises(TypeError, match="complex"):
        nmgen.NMMatrix.from_compressed(b.values + 0j, b.indices, "2:4", 8, (8, 8))
    for bad in (np.ones((8, 8), bool), np.ones((8, 8), object), np.full((8, 8), "1.5")):
        with pytest.raises(TypeError, match=f"weight has dtype {bad.dtype}"):
            nmgen.prune(bad, "2:4", 8)
        with pytest.raises(TypeError, match=f"values has dtype {bad.dtype}"):
            nmgen.NMMatrix.from_compressed(bad[:4], b.indices, "2:4", 8, (8, 8))


def test_integer_weights_are_still_taken():
    dense = np.arange(32, dtype=np.int64).reshape(8, 4)
    b = nmgen.prune(dense, "2:4", 4)
    assert b.dtype == nmgen.DType.F32
    np.testing.assert_array_equal(b.to_dense()[[2, 3, 6, 7]], dense[[2, 3, 6, 7]])


@pytest.mark.parametrize("bad", [(2.7, 4), (2, 4.0), (True, 4), (2, np.float64(4)), ("2", "4")])
def test_pattern_tuples_must_hold_integers(bad):
    with pytest.raises(TypeError, match="pattern .*integers"):
        Pattern.parse(bad)


def test_pattern_fields_must_be_integers():
    with pytest.raises(TypeError, match="pattern 2.5:4"):
        Pattern(2.5, 4)
    with pytest.raises(TypeError, match="integers"):
        Pattern(1, True)
    p = Pattern.parse((np.int64(2), np.uint8(4)))  # NumPy integers are fine
    assert p == Pattern(2, 4) and type(p.n) is int and type(p.m) is int
    assert Pattern.parse(" 2 : 4 ") == Pattern(2, 4)


@pytest.mark.parametrize("bad", [True, False, 8.0, "8", 0, -1])
def test_vec_must_be_a_positive_integer_not_a_bool(bad, rng):
    b = nmgen.prune(rng.standard_normal((8, 8)), "2:4", 1)
    with pytest.raises(ValueError, match="vec"):
        nmgen.prune(np.ones((8, 8)), "2:4", bad)
    with pytest.raises(ValueError, match="vec"):
        nmgen.NMMatrix.from_compressed(b.values, b.indices, "2:4", bad, (8, 8))


def test_numpy_integer_vec_is_fine(rng):
    b = nmgen.prune(rng.standard_normal((8, 8)), "2:4", np.int32(4))
    assert b.vec == 4 and type(b.vec) is int


@pytest.mark.parametrize("shape", [(0, 8), (8, 0), (0, 0)])
def test_empty_shapes_are_refused_by_prune_and_from_compressed(shape):
    with pytest.raises(ValueError, match=rf"shape \(K, N\) = \({shape[0]}, {shape[1]}\)"):
        nmgen.prune(np.ones(shape, np.float32), "2:4", 8)
    with pytest.raises(ValueError, match=rf"shape \(K, N\) = \({shape[0]}, {shape[1]}\)"):
        nmgen.NMMatrix.from_compressed(np.ones((0, shape[1])), np.ones((0, 1), np.uint8),
                                       "2:4", 8, shape)


def test_from_compressed_refuses_a_non_integer_shape(rng):
    b = nmgen.prune(rng.standard_normal((8, 8)), "2:4", 8)
    with pytest.raises(ValueError, match="integers"):
        nmgen.NMMatrix.from_compressed(b.values, b.indices, "2:4", 8, (8.5, 8))


def test_from_compressed_refuses_indices_into_the_padding(rng):
    # K=10 with 2:4: the last window (window 2) holds rows 8, 9 and two padding rows.
    b = nmgen.prune(rng.standard_normal((10, 16)), "2:4", 8)
    idx = np.array(b.indices)
    np.testing.assert_array_equal(idx[4:], [[0, 0], [1, 1]])
    idx[5, 1] = 3  # row 11 >= K: its values would vanish
    with pytest.raises(ValueError, match=r"window 2 .*K=10"):
        nmgen.NMMatrix.from_compressed(b.values, idx, "2:4", 8, (10, 16))


def test_from_compressed_allows_padding_only_where_the_window_is_too_short(rng):
    # K=9 with 2:4: the last window holds one real row, so one index must be padding ...
    b = nmgen.prune(rng.standard_normal((9, 8)), "2:4", 8)
    again = nmgen.NMMatrix.from_compressed(b.values, b.indices, "2:4", 8, (9, 8))
    np.testing.assert_array_equal(again.to_dense(), b.to_dense())
    # ... but it must keep the real row ...
    idx = np.array(b.indices)
    idx[4:, 0] = [1, 2]
    with pytest.raises(ValueError, match=r"window 2 .*K=9"):
        nmgen.NMMatrix.from_compressed(b.values, idx, "2:4", 8, (9, 8))
    # ... and hold zeros in the padding slot, or they would vanish.
    values = np.array(b.values)
    values[5, 3] = 1.0
    with pytest.raises(ValueError, match=r"window 2 hold 1 non-zero.*K=9"):
        nmgen.NMMatrix.from_compressed(values, b.indices, "2:4", 8, (9, 8))


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_valid_weights_behave_as_before(dtype, layout, rng):
    k, cols = 37, 21  # not multiples of m or L
    dense = rng.standard_normal((k, cols)).astype(np.float32)
    want = nmgen.DType.parse(dtype).numpy
    w = dense.astype(want) if layout == "kn" else dense.T.astype(want)
    b = nmgen.prune(w, "3:8", 8, layout=layout)
    assert b.dtype == nmgen.DType.parse(dtype) and b.shape == (k, cols)
    exact = dense.astype(want).astype(np.float32)
    expected = np.where(brute_force_keep(exact, 3, 8, 8), exact, 0)
    np.testing.assert_array_equal(b.to_dense().astype(np.float32), expected)
    again = nmgen.NMMatrix.from_compressed(b.values, b.indices, "3:8", 8, (k, cols))
    np.testing.assert_array_equal(again.to_dense(), b.to_dense())
    assert again.dtype == b.dtype
