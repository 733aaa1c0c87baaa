"""Property tests of the vector-wise N:M format (CPU only): pruning, padding, validation of
the compressed form and the float64 reference, over random patterns, L, K, N and data."""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import nmgen
from nmgen.format import NMMatrix, Pattern

VECS = [1, 2, 4, 8, 16]
FAST = settings(max_examples=100, deadline=None)


@st.composite
def patterns(draw, min_n: int = 1, n_below_m: bool = False) -> Pattern:
    """``n:m`` with ``m <= 16``, ``n >= min_n`` (and ``n < m`` if ``n_below_m``)."""
    m = draw(st.integers(min_n + n_below_m, 16))
    return Pattern(draw(st.integers(min_n, m - n_below_m)), m)


@st.composite
def weights(draw, k: int, cols: int) -> np.ndarray:
    """A ``k×cols`` float32 weight: any finite float32 (hypothesis' own arrays, shrinkable),
    Gaussian, or small integers (many ties, whole zero rows)."""
    kind = draw(st.sampled_from(["any", "normal", "ties"]))
    if kind == "any":
        return draw(hnp.arrays(np.float32, (k, cols),
                               elements=st.floats(width=32, allow_nan=False,
                                                  allow_infinity=False)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "normal":
        return rng.standard_normal((k, cols)).astype(np.float32)
    return rng.integers(-2, 3, (k, cols)).astype(np.float32) * (rng.random((k, 1)) < 0.7)


@st.composite
def problems(draw, max_dim: int = 70, min_n: int = 1):
    """(pattern, L, dense weight) with K, N from 1 to ``max_dim``."""
    pat = draw(patterns(min_n))
    vec = draw(st.sampled_from(VECS))
    k, cols = draw(st.integers(1, max_dim)), draw(st.integers(1, max_dim))
    return pat, vec, draw(weights(k, cols))


def kept_mask(b: NMMatrix) -> np.ndarray:
    """``K×N`` bool: where ``b`` keeps an entry, from its indices alone."""
    k, cols = b.shape
    mask = np.zeros((b.windows * b.m, b.indices.shape[1] * b.vec), bool)
    rows = b.kept_rows()  # W×G
    for q in range(rows.shape[1]):
        mask[rows[:, q], q * b.vec:(q + 1) * b.vec] = True
    return mask[:k, :cols]


# ------------------------------------------------------------------ pruning


@FAST
@given(problems())
def test_prune_of_a_pruned_weight_is_the_identity(problem):
    pat, vec, dense = problem
    b = nmgen.prune(dense, pat, vec)
    again = nmgen.prune(b.to_dense(), pat, vec)
    np.testing.assert_array_equal(again.indices, b.indices)
    np.testing.assert_array_equal(again.values, b.values)
    np.testing.assert_array_equal(again.to_dense(), b.to_dense())


@FAST
@given(problems(max_dim=40))
def test_kept_rows_have_the_largest_norms_ties_to_the_lower_row(problem):
    pat, vec, dense = problem
    b = nmgen.prune(dense, pat, vec)
    k, cols = dense.shape
    rows = b.kept_rows()  # W×G
    for w in range(b.windows):
        for q in range(rows.shape[1]):
            block = dense[w * pat.m:(w + 1) * pat.m, q * vec:(q + 1) * vec].astype(np.float64)
            # Exact-as-can-be norms (fsum); padding rows past K have norm 0.
            norms = [math.fsum(r * r) for r in block] + [0.0] * (pat.m - block.shape[0])
            kept = [int(r) - w * pat.m for r in rows[w * pat.n:(w + 1) * pat.n, q]]
            assert kept == sorted(set(kept)) and len(kept) == pat.n
            for i in kept:
                for j in set(range(pat.m)) - set(kept):
                    # An exact tie goes to the lower row; float64 summation may split a tie
                    # by an ulp either way (exact ties: the next test).
                    close = math.isclose(norms[i], norms[j], rel_tol=1e-12, abs_tol=0.0)
                    assert norms[i] > norms[j] or (norms[i] == norms[j] and i < j) or close, (
                        f"window {w}, group {q}: kept row {i} (norm² {norms[i]}) over row "
                        f"{j} (norm² {norms[j]})")


@FAST
@given(patterns(), st.sampled_from(VECS), st.integers(1, 40), st.integers(1, 40),
       st.integers(0, 2**32 - 1))
def test_ties_go_to_the_lower_row_exactly(pat, vec, k, cols, seed):
    # Small integers: the norms are exact, so every tie is a true tie.
    rng = np.random.default_rng(seed)
    dense = rng.integers(-1, 2, (k, cols)).astype(np.float32)
    b = nmgen.prune(dense, pat, vec)
    padded = np.zeros((b.windows * pat.m, b.padded_cols))
    padded[:k, :cols] = dense
    norms = (padded.reshape(b.windows, pat.m, -1, vec) ** 2).sum(axis=-1)  # W×m×G
    order = np.lexsort((np.arange(pat.m)[None, :, None] + 0 * norms, -norms), axis=1)
    want = np.sort(order[:, :pat.n, :], axis=1).reshape(b.windows * pat.n, -1)
    np.testing.assert_array_equal(b.indices, want)


@FAST
@given(problems(), st.integers(1, 5))
def test_padding_never_shows(problem, rows_a):
    pat, vec, dense = problem
    k, cols = dense.shape
    b = nmgen.prune(dense, pat, vec)
    windows, groups = -(-k // pat.m), -(-cols // vec)
    assert b.shape == (k, cols)
    assert b.values.shape == (windows * pat.n, cols)
    assert b.indices.shape == (windows * pat.n, groups) and b.indices.dtype == np.uint8
    assert b.to_dense().shape == (k, cols) and b.to_dense().dtype == np.float32
    a = np.ones((rows_a, k))
    assert nmgen.reference(a, b).shape == (rows_a, cols)
    mask = kept_mask(b)
    np.testing.assert_array_equal(b.to_dense(), np.where(mask, dense, 0))
    # Every (window, group) keeps n rows, or all its real rows where it has fewer.
    for w in range(windows):
        real = min(pat.m, k - w * pat.m)
        per_group = mask[w * pat.m:(w + 1) * pat.m].sum(axis=0)  # per column
        assert np.all(per_group == min(pat.n, real))


# ------------------------------------------------------------------ from_compressed


def _refused(b: NMMatrix, values, indices, error, match, shape=None):
    with pytest.raises(error, match=match):
        NMMatrix.from_compressed(values, indices, b.pattern, b.vec, shape or b.shape)


@FAST
@given(problems(max_dim=40), st.data())
def test_from_compressed_takes_back_what_prune_gives(problem, data):
    pat, vec, dense = problem
    b = nmgen.prune(dense, pat, vec)
    layout = data.draw(st.sampled_from([np.uint8, np.int32, np.int64]))
    again = NMMatrix.from_compressed(b.values, b.indices.astype(layout), pat, vec, b.shape)
    np.testing.assert_array_equal(again.to_dense(), b.to_dense())
    np.testing.assert_array_equal(again.indices, b.indices)


@FAST
@given(problems(max_dim=40), st.data())
def test_from_compressed_refuses_wrong_shapes(problem, data):
    pat, vec, dense = problem
    b = nmgen.prune(dense, pat, vec)
    axis, delta = data.draw(st.integers(0, 1)), data.draw(st.sampled_from([-1, 1]))
    for name, arr in (("values", b.values), ("indices", b.indices)):
        shape = list(arr.shape)
        shape[axis] += delta
        assume(shape[axis] >= 0)
        bad = np.zeros(shape, arr.dtype)
        common = tuple(slice(0, min(s, t)) for s, t in zip(shape, arr.shape, strict=True))
        bad[common] = arr[common]
        args = (bad, b.indices) if name == "values" else (b.values, bad)
        _refused(b, *args, ValueError, f"{name} has shape")


@FAST
@given(problems(max_dim=40), st.data())
def test_from_compressed_refuses_indices_out_of_range(problem, data):
    pat, vec, dense = problem
    b = nmgen.prune(dense, pat, vec)
    idx = b.indices.astype(np.int16)
    r = data.draw(st.integers(0, idx.shape[0] - 1))
    q = data.draw(st.integers(0, idx.shape[1] - 1))
    idx[r, q] = data.draw(st.one_of(st.integers(-300, -1), st.integers(pat.m, 300)))
    _refused(b, b.values, idx, ValueError, "out of range")


@FAST
@given(problems(max_dim=40, min_n=2), st.data())
def test_from_compressed_refuses_indices_not_strictly_ascending(problem, data):
    pat, vec, dense = problem
    b = nmgen.prune(dense, pat, vec)
    idx = np.array(b.indices)
    w = data.draw(st.integers(0, b.windows - 1))
    q = data.draw(st.integers(0, idx.shape[1] - 1))
    i = data.draw(st.integers(0, pat.n - 2))
    r = w * pat.n + i
    if data.draw(st.booleans()):
        idx[r, q], idx[r + 1, q] = idx[r + 1, q], idx[r, q]  # swapped
    else:
        idx[r + 1, q] = idx[r, q]  # repeated
    _refused(b, b.values, idx, ValueError, "ascending")


@FAST
@given(patterns(n_below_m=True), st.sampled_from(VECS), st.integers(1, 6),
       st.integers(1, 40), st.data())
def test_from_compressed_refuses_indices_into_the_padding(pat, vec, windows, cols, data):
    # (with n = m every index set is 0..m-1: the padding is unavoidable, next test)
    real = data.draw(st.integers(1, pat.m - 1))  # real rows of the last window
    k = (windows - 1) * pat.m + real
    b = nmgen.prune(data.draw(weights(k, cols)), pat, vec)
    # A last-window choice with fewer real rows than it could keep: min(n, real).
    lo, hi = max(0, pat.n - (pat.m - real)), min(pat.n, real) - 1  # lo <= hi as n < m
    inside = data.draw(st.integers(lo, hi))
    chosen = sorted(data.draw(st.permutations(range(real)))[:inside]
                    + data.draw(st.permutations(range(real, pat.m)))[:pat.n - inside])
    idx = np.array(b.indices)
    idx[-pat.n:, data.draw(st.integers(0, idx.shape[1] - 1))] = chosen
    _refused(b, b.values, idx, ValueError, rf"window {windows - 1} .*K={k}\b")


@FAST
@given(patterns(min_n=2), st.sampled_from(VECS), st.integers(1, 6), st.integers(1, 40),
       st.data())
def test_from_compressed_refuses_values_in_unavoidable_padding(pat, vec, windows, cols, data):
    real = data.draw(st.integers(1, pat.n - 1))  # the last window keeps n - real padding rows
    k = (windows - 1) * pat.m + real
    b = nmgen.prune(data.draw(weights(k, cols)), pat, vec)
    slots = np.argwhere(b.kept_rows()[:, np.arange(cols) // vec] >= k)  # (row, col) pairs
    r, c = slots[data.draw(st.integers(0, len(slots) - 1))]
    values = np.array(b.values)
    magnitude = data.draw(st.floats(2.0**-149, float(np.finfo(np.float32).max), width=32))
    values[r, c] = magnitude if data.draw(st.booleans()) else -magnitude
    _refused(b, values, b.indices, ValueError, rf"window {windows - 1} .*K={k}\b")


@FAST
@given(problems(max_dim=40), st.sampled_from([np.float32, np.float64, np.bool_]))
def test_from_compressed_refuses_non_integer_indices(problem, dtype):
    pat, vec, dense = problem
    b = nmgen.prune(dense, pat, vec)
    _refused(b, b.values, b.indices.astype(dtype), TypeError, "indices must be integers")


@FAST
@given(problems(max_dim=40), st.data())
def test_from_compressed_refuses_non_finite_values(problem, data):
    pat, vec, dense = problem
    b = nmgen.prune(dense, pat, vec)
    values = np.array(b.values)
    spots = data.draw(st.sets(st.tuples(st.integers(0, values.shape[0] - 1),
                                        st.integers(0, values.shape[1] - 1)),
                              min_size=1, max_size=5))
    for spot in spots:
        values[spot] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    _refused(b, values, b.indices, ValueError,
             rf"values holds {len(spots)} non-finite values \(NaN or inf\)")


@FAST
@given(problems(max_dim=40), st.data())
def test_prune_refuses_non_finite_weights(problem, data):
    pat, vec, dense = problem
    dense = np.array(dense)
    spots = data.draw(st.sets(st.tuples(st.integers(0, dense.shape[0] - 1),
                                        st.integers(0, dense.shape[1] - 1)),
                              min_size=1, max_size=5))
    for spot in spots:
        dense[spot] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    with pytest.raises(ValueError, match=rf"weight holds {len(spots)} non-finite values"):
        nmgen.prune(dense, pat, vec)


# ------------------------------------------------------------------ the reference


@FAST
@given(problems(), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_reference_agrees_with_the_dense_product(problem, rows_a, seed):
    pat, vec, dense = problem
    dense = np.clip(dense, -1e6, 1e6)  # keep the float64 products far from overflow
    b = nmgen.prune(dense, pat, vec)
    a = np.random.default_rng(seed).standard_normal((rows_a, dense.shape[0])) * 10.0
    ref = nmgen.reference(a, b)
    dense64 = b.to_dense().astype(np.float64)
    exact = a @ dense64
    assert ref.shape == exact.shape and ref.dtype == np.float64
    # Relative to the sum of the magnitudes (what bounds a dot product's rounding), which
    # stays meaningful where the terms cancel; and relative in norm where they do not.
    scale = np.abs(a) @ np.abs(dense64)
    assert np.all(np.abs(ref - exact) <= 1e-12 * scale)
    norm = np.linalg.norm(exact)
    if norm > 0 and norm >= 1e-3 * np.linalg.norm(scale):
        assert np.linalg.norm(ref - exact) / norm < 1e-12


def test_compressed_arrays_are_row_major_whatever_the_input_order():
    """Kernels index ``_values``/``_indices`` flat in C order: a transposed (F-order) input
    must not reach them as such."""
    dense = np.random.default_rng(3).standard_normal((50, 61)).T  # F-order K×N
    for weight in (nmgen.prune(dense, "2:4", 8), nmgen.prune(dense.T, "2:4", 8, layout="nk")):
        assert weight._values.flags["C_CONTIGUOUS"] and weight._indices.flags["C_CONTIGUOUS"]
