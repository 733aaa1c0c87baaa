"""The vector-wise N:M sparse format (DESIGN §1): pruning, the compressed form, the reference.

``B`` (``K×N``) is split into windows of ``m`` rows and groups of ``L`` columns; every
(window, group) keeps the same ``n`` rows for all ``L`` columns. The compressed form is

- ``values``  ``W×N`` with ``W = ⌈K/m⌉·n``: ``values[w·n+i, j] = B[w·m + idx(w, j//L, i), j]``
- ``indices`` ``W×⌈N/L⌉`` uint8: ``indices[w·n+i, q] = idx(w, q, i)``, ascending in ``i``.

``K`` and ``N`` that are not multiples of ``m`` and ``L`` are padded with zeros inside;
the padding never shows in ``shape``, ``values``, ``to_dense()`` or a product. The values
keep their dtype (``DType``: float32, bfloat16 or float16); bfloat16 arrays on the host are
``ml_dtypes.bfloat16``, as NumPy has none of its own.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import ml_dtypes
import numpy as np

_PATTERN_RE = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")
MAX_M = 256  # indices are stored as uint8


class DType(str, Enum):
    """The dtype of a weight's values and of the activations multiplied with them."""

    F32 = "f32"
    BF16 = "bf16"
    F16 = "f16"

    @property
    def numpy(self) -> np.dtype:
        return np.dtype({"f32": np.float32, "bf16": ml_dtypes.bfloat16,
                         "f16": np.float16}[self.value])

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @classmethod
    def parse(cls, text: str | DType) -> DType:
        """``"fp32"``, ``"float32"``, ``"f32"``, ``"bf16"``, ... as a ``DType``."""
        if isinstance(text, DType):
            return text
        key = str(text).lower().replace("float", "f").replace("fp", "f")
        key = {"bf16": "bf16", "bfloat16": "bf16", "bf": "bf16"}.get(key, key)
        try:
            return cls(key)
        except ValueError:
            allowed = ", ".join(d.value for d in cls)
            raise ValueError(f"dtype {text!r}: expected one of {allowed}") from None

    @classmethod
    def of(cls, array: Any) -> DType | None:
        """The ``DType`` of a NumPy, CuPy or PyTorch array; ``None`` for any other dtype."""
        name = str(getattr(array, "dtype", "")).removeprefix("torch.")
        return _DTYPE_NAMES.get(name)


_DTYPE_NAMES = {"float32": DType.F32, "bfloat16": DType.BF16, "float16": DType.F16}


@dataclass(frozen=True)
class Pattern:
    """An ``n:m`` pattern: keep ``n`` of every ``m`` rows."""

    n: int
    m: int

    def __post_init__(self) -> None:
        if not (1 <= self.n <= self.m):
            raise ValueError(f"pattern {self.n}:{self.m}: need 1 <= n <= m")
        if self.m > MAX_M:
            raise ValueError(f"pattern {self.n}:{self.m}: m must be <= {MAX_M} (uint8 indices)")

    @classmethod
    def parse(cls, pattern: str | tuple[int, int] | Pattern) -> Pattern:
        if isinstance(pattern, Pattern):
            return pattern
        if isinstance(pattern, str):
            match = _PATTERN_RE.match(pattern)
            if not match:
                raise ValueError(f"pattern {pattern!r}: expected 'n:m', e.g. '2:4'")
            return cls(int(match.group(1)), int(match.group(2)))
        if isinstance(pattern, tuple) and len(pattern) == 2:
            return cls(int(pattern[0]), int(pattern[1]))
        raise TypeError(f"pattern {pattern!r}: expected 'n:m' or (n, m)")

    @property
    def sparsity(self) -> float:
        return 1.0 - self.n / self.m

    def __str__(self) -> str:
        return f"{self.n}:{self.m}"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def to_numpy(x: Any) -> np.ndarray:
    """A host NumPy view/copy of a NumPy array, CuPy array or PyTorch tensor (a torch
    bfloat16 tensor becomes an ``ml_dtypes.bfloat16`` array of the same bits)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor
        host = x.detach().cpu()
        if str(host.dtype) == "torch.bfloat16":
            return host.view(_torch_int16(host)).numpy().view(ml_dtypes.bfloat16)
        return host.numpy()
    if hasattr(x, "get") and hasattr(x, "__cuda_array_interface__"):  # cupy.ndarray
        return x.get()
    return np.asarray(x)


def _torch_int16(tensor: Any) -> Any:
    return importlib.import_module(type(tensor).__module__.split(".")[0]).int16


def _values_dtype(array: np.ndarray, dtype: DType | str | None) -> np.dtype:
    """The host dtype values are kept in: ``dtype`` if given, else the array's own where
    it is one of ``DType``'s, else float32."""
    if dtype is not None:
        return DType.parse(dtype).numpy
    own = DType.of(array)
    return (own or DType.F32).numpy


@dataclass(eq=False)
class NMMatrix:
    """A ``K×N`` matrix in vector-wise N:M form (see the module docstring).

    Internally ``_values`` is ``W×Np`` and ``_indices`` ``W×Np/L``, with ``Np`` the
    column count padded to a multiple of ``L``; padded columns hold zeros.
    """

    _values: np.ndarray
    _indices: np.ndarray
    pattern: Pattern
    vec: int
    shape: tuple[int, int]
    # Device-side preparations (kernel layouts), keyed by preparation key and device.
    _prepared: dict[Any, Any] = field(default_factory=dict, repr=False)

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_compressed(
        cls,
        values: Any,
        indices: Any,
        pattern: str | tuple[int, int] | Pattern,
        vec: int,
        shape: tuple[int, int],
        dtype: DType | str | None = None,
    ) -> NMMatrix:
        """Build from given ``values`` (``W×N``) and ``indices`` (``W×⌈N/L⌉``), validated.
        The values keep their dtype (float32, bfloat16 or float16; any other becomes
        float32) unless ``dtype`` says otherwise."""
        pat = Pattern.parse(pattern)
        k, n_cols = (int(s) for s in shape)
        _check_vec(vec)
        if k < 1 or n_cols < 1:
            raise ValueError(f"shape {shape}: K and N must be >= 1")
        w_rows = _ceil_div(k, pat.m) * pat.n
        groups = _ceil_div(n_cols, vec)
        host_values = to_numpy(values)
        vals = np.ascontiguousarray(host_values, dtype=_values_dtype(host_values, dtype))
        idx = to_numpy(indices)
        if vals.shape != (w_rows, n_cols):
            raise ValueError(
                f"values has shape {vals.shape}; pattern {pat} with K={k}, N={n_cols} "
                f"needs (W, N) = ({w_rows}, {n_cols})"
            )
        if idx.shape != (w_rows, groups):
            raise ValueError(
                f"indices has shape {idx.shape}; pattern {pat}, vec {vec} with K={k}, "
                f"N={n_cols} needs (W, ceil(N/L)) = ({w_rows}, {groups})"
            )
        if not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"indices must be integers, got {idx.dtype}")
        _validate_indices(idx.astype(np.int64), pat)
        padded_cols = groups * vec
        vals_p = np.zeros((w_rows, padded_cols), vals.dtype)
        vals_p[:, :n_cols] = vals
        return cls(vals_p, idx.astype(np.uint8), pat, vec, (k, n_cols))

    # ---------------------------------------------------------------- public views
    @property
    def dtype(self) -> DType:
        """The values' dtype."""
        return DType.of(self._values)

    @property
    def values(self) -> np.ndarray:
        """``W×N`` kept values in the matrix's dtype (a read-only view)."""
        view = self._values[:, : self.shape[1]]
        view.flags.writeable = False
        return view

    @property
    def indices(self) -> np.ndarray:
        """``W×⌈N/L⌉`` uint8 kept-row indices within each window (a read-only view)."""
        view = self._indices.view()
        view.flags.writeable = False
        return view

    @property
    def n(self) -> int:
        return self.pattern.n

    @property
    def m(self) -> int:
        return self.pattern.m

    @property
    def windows(self) -> int:
        return self._values.shape[0] // self.pattern.n

    @property
    def padded_cols(self) -> int:
        return self._values.shape[1]

    def kept_rows(self) -> np.ndarray:
        """``W×G`` int64: the dense row (``k``) of every compressed row in every group."""
        window = np.arange(self._values.shape[0]) // self.pattern.n
        return window[:, None] * self.pattern.m + self._indices.astype(np.int64)

    def to_dense(self) -> np.ndarray:
        """The logical ``K×N`` matrix in the values' dtype (zeros where pruned)."""
        k, n_cols = self.shape
        rows = self.kept_rows()  # W×G
        cols = np.arange(self.padded_cols)
        dense = np.zeros((self.windows * self.pattern.m, self.padded_cols), self._values.dtype)
        dense[rows[:, cols // self.vec], cols[None, :]] = self._values
        return dense[:k, :n_cols]

    def __repr__(self) -> str:
        return (f"NMMatrix(shape={self.shape}, pattern={self.pattern}, vec={self.vec}, "
                f"dtype={self.dtype.value})")


def _check_vec(vec: int) -> None:
    if not isinstance(vec, (int, np.integer)) or vec < 1:
        raise ValueError(f"vec {vec!r}: the vector length L must be a positive integer")


def _validate_indices(idx: np.ndarray, pat: Pattern) -> None:
    if idx.size == 0:
        return
    if idx.min() < 0 or idx.max() >= pat.m:
        raise ValueError(f"indices out of range: every index must be in [0, {pat.m}) for {pat}")
    per_window = idx.reshape(-1, pat.n, idx.shape[1])
    if pat.n > 1 and not np.all(np.diff(per_window, axis=1) > 0):
        raise ValueError(
            f"indices must be strictly ascending within each window of {pat.n} "
            "(no repeats): found a window where they are not"
        )


def prune(
    w: Any,
    pattern: str | tuple[int, int] | Pattern,
    vec: int,
    layout: str = "kn",
    dtype: DType | str | None = None,
) -> NMMatrix:
    """Prune a dense weight to vector-wise N:M, keeping the largest-L2-norm row vectors.

    ``layout="kn"``: ``w`` is ``K×N`` (``y = x @ w``). ``layout="nk"``: ``w`` is a
    PyTorch ``nn.Linear.weight`` ``[out, in] = [N, K]`` (``y = x @ w.T``); it is
    transposed here so that the result multiplies as ``x @ B`` either way. The values
    keep ``w``'s dtype where it is float32, bfloat16 or float16 (others become float32),
    or take ``dtype``; the norms are computed in float64.
    """
    pat = Pattern.parse(pattern)
    _check_vec(vec)
    dense = to_numpy(w)
    if dense.ndim != 2:
        raise ValueError(f"weight must be 2-D, got shape {dense.shape}")
    if layout == "nk":
        dense = dense.T
    elif layout != "kn":
        raise ValueError(f"layout {layout!r}: expected 'kn' (K×N) or 'nk' (PyTorch [out, in])")
    dense = np.asarray(dense, dtype=_values_dtype(dense, dtype))
    k, n_cols = dense.shape
    windows, groups = _ceil_div(k, pat.m), _ceil_div(n_cols, vec)
    padded = np.zeros((windows * pat.m, groups * vec), dense.dtype)
    padded[:k, :n_cols] = dense
    # blocks[w, r, q, l] = B[w·m + r, q·L + l]
    blocks = padded.reshape(windows, pat.m, groups, vec)
    # bfloat16 and float16 are exact in float32, which einsum sums in float64
    exact = blocks if blocks.dtype == np.float32 else blocks.astype(np.float32)
    norms = np.einsum("wrql,wrql->wqr", exact, exact, dtype=np.float64)  # windows×G×m
    # Largest n norms; stable order on ties so that the choice is deterministic.
    keep = np.sort(np.argsort(-norms, axis=-1, kind="stable")[..., : pat.n], axis=-1)
    indices = keep.transpose(0, 2, 1).reshape(windows * pat.n, groups)  # W×G
    rows = (np.arange(windows * pat.n) // pat.n)[:, None] * pat.m + indices
    cols = np.arange(groups * vec)
    values = padded[rows[:, cols // vec], cols[None, :]]
    return NMMatrix(values, indices.astype(np.uint8), pat, vec, (k, n_cols))


def reference(a: Any, b: NMMatrix) -> Any:
    """``a @ b`` in float64, computed from the compressed form (never densified).

    ``a`` is ``M×K`` (NumPy, CuPy or PyTorch). With a CuPy array the product runs on the
    GPU in float64 and a CuPy array comes back; otherwise NumPy.
    """
    xp = _array_module(a)
    a64 = xp.asarray(a if xp is not np else to_numpy(a), dtype=xp.float64)
    if a64.ndim != 2 or a64.shape[1] != b.shape[0]:
        raise ValueError(f"a has shape {tuple(a64.shape)}; b is {b.shape[0]}×{b.shape[1]}")
    k = b.shape[0]
    rows = b.kept_rows()  # W×G dense row of each compressed row per group
    values = xp.asarray(b._values.astype(np.float64))
    out = xp.zeros((a64.shape[0], b.padded_cols), dtype=xp.float64)
    for q in range(rows.shape[1]):
        live = rows[:, q] < k  # rows in the K padding hold zeros: skip them
        gathered = a64[:, xp.asarray(rows[live, q])]
        cols = slice(q * b.vec, (q + 1) * b.vec)
        out[:, cols] = gathered @ values[xp.asarray(np.nonzero(live)[0]), cols]
    return out[:, : b.shape[1]]


def _array_module(a: Any) -> Any:
    """CuPy for a CuPy array (the module it came from: format imports no GPU library),
    else NumPy."""
    if hasattr(a, "__cuda_array_interface__") and type(a).__module__.startswith("cupy"):
        return importlib.import_module("cupy")
    return np
