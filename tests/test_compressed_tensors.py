"""compressed-tensors' sparse-24-bitmask weights read as element-wise 2:4 (and written back),
against their dense form; the tensors are made here as that format's compressor makes them
(the two largest magnitudes of each group of four along the input features kept, the mask
packed eight positions a byte, the first in the lowest bit)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import nmgen
from nmgen.compressed_tensors import from_sparse_24_bitmask, to_sparse_24_bitmask


def compress_like_the_format(weight: np.ndarray) -> dict[str, np.ndarray]:
    rows, cols = weight.shape
    groups = np.abs(weight.astype(np.float32)).reshape(rows, cols // 4, 4)
    top = np.argsort(-groups, axis=2, kind="stable")[..., :2]
    mask = np.zeros_like(groups, bool)
    np.put_along_axis(mask, top, True, axis=2)
    mask = mask.reshape(rows, cols)
    return {"shape": np.array([[rows], [cols]]),
            "compressed": weight[mask].reshape(rows, cols // 2),
            "bitmask": np.packbits(mask, axis=1, bitorder="little")}


def two_of_four_weight(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """A [out, in] bf16 weight already 2:4 along in, some groups with fewer non-zeros and
    signed zeros."""
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    groups = w.reshape(rows, cols // 4, 4)
    drop = np.argsort(rng.random(groups.shape), axis=2)[..., :2]
    np.put_along_axis(groups, drop, -0.0, axis=2)
    groups[rng.random(groups.shape[:2]) < 0.1, 0] = 0.0  # some keep fewer than two
    return w.astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize(("rows", "cols"), [(16, 32), (5, 12), (64, 8)])
def test_a_bitmask_tensor_reads_as_its_dense_form(rows, cols):
    weight = two_of_four_weight(np.random.default_rng(rows * cols), rows, cols)
    stored = compress_like_the_format(weight)
    b = from_sparse_24_bitmask(stored["compressed"], stored["bitmask"], stored["shape"])
    assert (b.n, b.m, b.vec, b.shape) == (2, 4, 1, (cols, rows))
    assert b.dtype is nmgen.DType.BF16
    np.testing.assert_array_equal(b.to_dense().T.astype(np.float32), weight.astype(np.float32))
    written = to_sparse_24_bitmask(b)
    np.testing.assert_array_equal(written["bitmask"], stored["bitmask"])
    np.testing.assert_array_equal(written["compressed"].view(np.uint16),
                                  stored["compressed"].view(np.uint16))  # bit for bit
    np.testing.assert_array_equal(written["shape"], stored["shape"])


def test_a_bitmask_that_keeps_three_of_four_is_refused_naming_the_group():
    weight = two_of_four_weight(np.random.default_rng(1), 4, 16)
    stored = compress_like_the_format(weight)
    stored["bitmask"][2, 1] = (stored["bitmask"][2, 1] & 0x0F) | 0x70  # features 12-15: three
    with pytest.raises(ValueError, match="row 2 keeps 3 of input features 12-15"):
        from_sparse_24_bitmask(stored["compressed"], stored["bitmask"], stored["shape"])


def test_sizes_that_do_not_line_up_are_refused():
    stored = compress_like_the_format(two_of_four_weight(np.random.default_rng(2), 4, 16))
    with pytest.raises(ValueError, match="compressed has shape"):
        from_sparse_24_bitmask(stored["compressed"][:, :4], stored["bitmask"], stored["shape"])
    with pytest.raises(ValueError, match="multiple of 4"):
        from_sparse_24_bitmask(stored["compressed"], stored["bitmask"], np.array([4, 14]))
