"""The vector-wise N:M sparse format (docs/design.md §1): pruning, the compressed form, the
reference.

``B`` (``K×N``) is split into windows of ``m`` rows and groups of ``L`` columns; every
(window, group) keeps the same ``n`` rows for all ``L`` columns. The compressed form is

- ``values``  ``W×N`` with ``W = ⌈K/m⌉·n``: ``values[w·n+i, j] = B[w·m + idx(w, j//L, i), j]``
- ``indices`` ``W×⌈N/L⌉`` uint8: ``indices[w·n+i, q] = idx(w, q, i)``, ascending in ``i``.

The layout rule: a weight given as a PyTorch tensor must say its ``layout`` (``"nk"``: an
``nn.Linear.weight``, ``[out, in] = [N, K]``; ``"kn"``: ``K×N``), in ``prune`` and
``NMMatrix.from_compressed`` alike; PyTorch stores weights ``[out, in]`` while NumPy's
``x @ w`` reads ``K×N``, and a square weight fits both, so a default would multiply it as
its transpose without an error. NumPy and CuPy arrays are ``K×N`` unless ``layout`` says
otherwise. ``nmgen.nn`` takes ``nn.Linear`` layers, whose layout it knows.

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

from .epilogue import Activation, apply_reference, array_module

_PATTERN_RE = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")
MAX_M = 256  # indices are stored as uint8
# The kernels index rows, columns and depth, and hold L, in 32-bit ints (nmgen.shapes.MAX_DIM).
MAX_INDEX = 2**31 - 1
# A vector longer than the weight's N columns holds only zeros past them: L may exceed N
# (a kernel tuned at L = 32 serves a 16-column weight) up to this many columns.
MAX_VEC_PAST_N = 4096


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
    def parse(cls, text: Any) -> DType:
        """``"fp32"``, ``"float32"``, ``"f32"``, ``"bf16"``, ... as a ``DType``; so are the
        NumPy, ``ml_dtypes`` and PyTorch dtypes of those names (``np.float16``,
        ``torch.bfloat16``)."""
        if isinstance(text, DType):
            return text
        name = _dtype_name(text)
        key = name.lower().replace("float", "f").replace("fp", "f")
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


def _dtype_name(dtype: Any) -> str:
    """The name of a dtype given as text, a NumPy dtype or scalar type, or a torch dtype."""
    if isinstance(dtype, str):
        return dtype
    if isinstance(dtype, type) and issubclass(dtype, np.generic):
        return np.dtype(dtype).name
    if isinstance(dtype, np.dtype):
        return dtype.name
    text = str(dtype)
    return text.removeprefix("torch.") if text.startswith("torch.") else text


@dataclass(frozen=True)
class Pattern:
    """An ``n:m`` pattern: keep ``n`` of every ``m`` rows."""

    n: int
    m: int

    def __post_init__(self) -> None:
        if not (_is_int(self.n) and _is_int(self.m)):
            raise TypeError(f"pattern {self.n!r}:{self.m!r}: n and m must be integers, got "
                            f"{type(self.n).__name__} and {type(self.m).__name__}")
        # NumPy integers become Python ints (equal, hashable alike, and JSON-serialisable).
        object.__setattr__(self, "n", int(self.n))
        object.__setattr__(self, "m", int(self.m))
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
            if not (_is_int(pattern[0]) and _is_int(pattern[1])):
                raise TypeError(f"pattern {pattern!r}: (n, m) must be integers, e.g. (2, 4)")
            return cls(pattern[0], pattern[1])
        raise TypeError(f"pattern {pattern!r}: expected 'n:m' or (n, m)")

    @property
    def sparsity(self) -> float:
        return 1.0 - self.n / self.m

    def __str__(self) -> str:
        return f"{self.n}:{self.m}"


def _is_int(x: Any) -> bool:
    """A Python or NumPy integer, not a bool (``True`` is an ``int`` to Python)."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def to_numpy(x: Any) -> np.ndarray:
    """A host NumPy view/copy of a NumPy array, CuPy array or PyTorch tensor (a torch
    bfloat16 tensor becomes an ``ml_dtypes.bfloat16`` array of the same bits)."""
    if isinstance(x, np.ma.MaskedArray):
        raise TypeError("a masked array: its masked entries would be read as values; pass "
                        "x.filled(0) (or the fill you mean)")
    if isinstance(x, np.ndarray):
        return x
    if x is None:
        raise TypeError("expected an array (NumPy, CuPy or PyTorch), got None")
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor
        if getattr(x, "is_meta", False):
            raise ValueError("a tensor on the meta device holds no values: load the weights "
                             "first")
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


def _as_values(array: np.ndarray, dtype: DType | str | None, what: str) -> np.ndarray:
    """``array`` in the values' dtype (see ``_values_dtype``), refused (naming it ``what``)
    where it is complex, not numeric, holds NaN or inf, or overflows that dtype."""
    kind = array.dtype.kind
    if kind == "c":
        raise TypeError(f"{what} is complex ({array.dtype}): N:M values are real; pass "
                        "its .real if the imaginary part is meant to go")
    if kind not in "iuf" and not _is_ml_dtype(array.dtype):
        raise TypeError(f"{what} has dtype {array.dtype}: expected real numbers (float32, "
                        "bfloat16, float16 or another float or integer dtype)")
    _check_finite(array, what)
    target = _values_dtype(array, dtype)
    with np.errstate(over="ignore"):
        cast = np.asarray(array, dtype=target)
    if cast.dtype != array.dtype:
        overflow = int(np.count_nonzero(~np.isfinite(cast)))
        if overflow:
            limit = float(ml_dtypes.finfo(target).max)
            raise ValueError(f"{what} holds {overflow} value(s) beyond the range of "
                             f"{DType.of(cast).value} (|x| > {limit:g}): they would become inf")
    return cast


def _is_ml_dtype(dt: np.dtype) -> bool:
    """One of ml_dtypes' numeric types (bfloat16, float8_*, int4, ...)."""
    return dt.kind == "V" and dt.type.__module__.startswith("ml_dtypes") and not dt.names


def _check_finite(array: np.ndarray, what: str) -> None:
    if array.dtype.kind in "iu":
        return
    bad = array.size - int(np.count_nonzero(np.isfinite(array)))
    if bad:
        raise ValueError(f"{what} holds {bad} non-finite values (NaN or inf): "
                         f"{'prune a finite weight' if what == 'weight' else 'pass finite values'}")


LAYOUTS = ("kn", "nk")


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a PyTorch tensor (told without importing torch)."""
    return any(c.__module__.startswith("torch") and c.__name__ == "Tensor"
               for c in type(x).__mro__)


def _layout(layout: str | None, *arrays: Any) -> str:
    """``layout`` checked; where it is not given, ``"kn"``, except for a PyTorch weight,
    which must say it (see the module docstring)."""
    if layout is None:
        if any(is_torch(a) for a in arrays):
            raise ValueError("a PyTorch weight needs layout=: 'nk' for an nn.Linear weight "
                             "([out, in] = [N, K], y = x @ w.T) or 'kn' for a K×N matrix "
                             "(y = x @ w); a square weight fits both, so none is assumed")
        return "kn"
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected 'kn' (K×N) or 'nk' (PyTorch [out, in])")
    return layout


def _check_shape(k: int, n_cols: int) -> None:
    if k < 1 or n_cols < 1:
        raise ValueError(f"shape (K, N) = ({k}, {n_cols}): K and N must be >= 1")
    if max(k, n_cols) > MAX_INDEX:
        raise ValueError(f"shape (K, N) = ({k}, {n_cols}): K and N must be at most "
                         f"{MAX_INDEX} (the kernels index in 32 bits)")


def check_width(vec: int, n_cols: int) -> None:
    """Refuse an ``L`` past what a weight of ``n_cols`` columns can use: beyond
    ``max(N, MAX_VEC_PAST_N)`` (a vector past the last column is all zeros: one of
    10**9 columns would allocate gigabytes of them), or padding ``N`` past 32-bit indexing."""
    if vec > max(n_cols, MAX_VEC_PAST_N):
        raise ValueError(f"vec {vec}: longer than the weight's N = {n_cols} columns and than "
                         f"{MAX_VEC_PAST_N}, the most nmgen pads a vector to past N (the "
                         "padding holds only zeros); take L <= max(N, "
                         f"{MAX_VEC_PAST_N})")
    padded = _ceil_div(n_cols, vec) * vec
    if padded > MAX_INDEX:
        raise ValueError(f"vec {vec}: pads N = {n_cols} to {padded} columns, past "
                         f"{MAX_INDEX} (the kernels index in 32 bits)")


@dataclass(eq=False)
class NMMatrix:
    """A ``K×N`` matrix in vector-wise N:M form (see the module docstring).

    Internally ``_values`` is ``W×Np`` and ``_indices`` ``W×Np/L``, both row-major (C
    order: what a kernel's flat indexing reads), with ``Np`` the column count padded to
    a multiple of ``L``; padded columns hold zeros.
    """

    _values: np.ndarray
    _indices: np.ndarray
    pattern: Pattern
    vec: int
    shape: tuple[int, int]
    # Device-side preparations (kernel layouts), keyed by preparation key and device.
    _prepared: dict[Any, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._values = np.ascontiguousarray(self._values)
        self._indices = np.ascontiguousarray(self._indices)

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
        layout: str | None = None,
    ) -> NMMatrix:
        """Build from given ``values`` (``W×N``) and ``indices`` (``W×⌈N/L⌉``), validated.
        The values keep their dtype (float32, bfloat16 or float16; any other real dtype
        becomes float32) unless ``dtype`` says otherwise.

        ``layout="kn"``: as above, ``shape`` is ``(K, N)`` (a ``SparseLinear``'s buffers are
        so, with ``N`` its output features). ``layout="nk"``: everything transposed, the
        PyTorch ``[out, in]`` way: ``values`` ``N×W``, ``indices`` ``⌈N/L⌉×W``, ``shape``
        ``(N, K)``. Required where ``values`` or ``indices`` is a PyTorch tensor (the
        module docstring's layout rule); ``"kn"`` otherwise.

        Refused, as each would be silently lost or misread otherwise:

        - a PyTorch ``values`` or ``indices`` without ``layout``: a square weight would be
          read as its transpose.

        - ``shape`` not two integers, or ``K`` or ``N`` < 1: there is nothing to multiply.
        - ``vec`` not a positive integer (a bool included): ``True`` is not a length.
        - ``K`` or ``N`` past 2**31 - 1, or ``vec`` past ``max(N, MAX_VEC_PAST_N)``: the
          kernels index in 32 bits, and a vector past ``N`` holds only zeros.
        - a ``pattern`` tuple of non-integers: ``(2.7, 4)`` would be truncated to 2:4.
        - complex ``values`` (TypeError): the imaginary part would be dropped.
        - non-numeric ``values`` (bool, object, str; TypeError): not weights.
        - ``values`` or ``indices`` of the wrong shape: they would not line up.
        - ``values`` holding NaN or inf: they poison every product they touch.
        - ``values`` beyond the range of ``dtype``: they would become inf.
        - non-integer ``indices`` (TypeError): a float index would be truncated.
        - an index outside ``[0, m)`` or not strictly ascending within a window: it names
          no row, or a row twice.
        - an index into the zero padding of the last window (row ≥ ``K``) where that
          window has ``n`` real rows to keep, and any non-zero value in a padding slot
          (only where it has fewer): the value would vanish from every product.
        """
        pat = Pattern.parse(pattern)
        layout = _layout(layout, values, indices)
        if not isinstance(shape, (tuple, list)) or len(shape) != 2 \
                or not all(_is_int(s) for s in shape):
            raise ValueError(f"shape {shape!r}: expected (K, N), two integers")
        k, n_cols = (int(s) for s in (shape if layout == "kn" else shape[::-1]))
        vec = check_vec(vec)
        _check_shape(k, n_cols)
        check_width(vec, n_cols)
        w_rows = _ceil_div(k, pat.m) * pat.n
        groups = _ceil_div(n_cols, vec)
        host_values, idx = to_numpy(values), to_numpy(indices)
        if layout == "nk":
            host_values, idx = _transposed(host_values, "values"), _transposed(idx, "indices")
        vals = _as_values(host_values, dtype, "values")
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
        idx64 = idx.astype(np.int64)
        _validate_indices(idx64, pat)
        _validate_padding(vals, idx64, pat, vec, k)
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

    def copy(self) -> NMMatrix:
        """The same matrix (its host arrays shared, read-only) with device layouts of its
        own: what a benchmark rotates through to keep a weight out of L2."""
        return NMMatrix(self._values, self._indices, self.pattern, self.vec, self.shape)

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


def _transposed(array: np.ndarray, what: str) -> np.ndarray:
    if array.ndim != 2:
        raise ValueError(f"{what} has shape {array.shape}: expected 2-D")
    return array.T


def check_vec(vec: int) -> int:
    """``vec`` as a Python int, refused unless a positive (Python or NumPy) integer that
    the kernels' 32-bit ints hold."""
    if not _is_int(vec) or vec < 1:
        what = " (a bool is not a length)" if isinstance(vec, (bool, np.bool_)) else ""
        raise ValueError(f"vec {vec!r}: the vector length L must be a positive integer{what}")
    if vec > MAX_INDEX:
        raise ValueError(f"vec {vec}: the vector length L must be at most {MAX_INDEX} (the "
                         "kernels hold it in a 32-bit int)")
    return int(vec)



def _validate_indices(idx: np.ndarray, pat: Pattern) -> None:
    if idx.min() < 0 or idx.max() >= pat.m:
        raise ValueError(f"indices out of range: every index must be in [0, {pat.m}) for {pat}")
    per_window = idx.reshape(-1, pat.n, idx.shape[1])
    if pat.n > 1 and not np.all(np.diff(per_window, axis=1) > 0):
        raise ValueError(
            f"indices must be strictly ascending within each window of {pat.n} "
            "(no repeats): found a window where they are not"
        )


def _validate_padding(vals: np.ndarray, idx: np.ndarray, pat: Pattern, vec: int,
                      k: int) -> None:
    """The last window's rows at or past ``K`` are zero padding: what is kept there would
    vanish. An index may point there only where the window has fewer than ``n`` real rows
    (it then keeps all of them), and the values it holds must be zero."""
    windows = idx.shape[0] // pat.n
    last = windows - 1
    real = k - last * pat.m  # rows of the last window inside K
    if real == pat.m:
        return
    tail = idx[-pat.n:]  # n×G, ascending
    inside = np.count_nonzero(tail < real, axis=0)
    short = np.nonzero(inside < min(pat.n, real))[0]
    if short.size:
        q = int(short[0])
        rows = [last * pat.m + int(i) for i in tail[:, q]]
        first = last * pat.m
        span = f"row {first}" if real == 1 else f"rows {first}..{k - 1}"
        need = (f"all its real {span}, as it has fewer than n={pat.n}" if real < pat.n
                else f"only rows < {k}")
        raise ValueError(
            f"indices of window {last} (group {q}) keep rows {rows}, some in the zero "
            f"padding past K={k}, where their values would vanish: that window must keep "
            f"{need} (indices < {real})"
        )
    if real < pat.n:
        slots = np.repeat(tail >= real, vec, axis=1)[:, : vals.shape[1]]  # n×N
        lost = int(np.count_nonzero(vals[-pat.n:][slots] != 0))
        if lost:
            raise ValueError(
                f"values of window {last} hold {lost} non-zero value(s) in the "
                f"{pat.n - real} slot(s) per group that K={k} leaves in the zero padding "
                f"(the window has {real} real rows for n={pat.n}): they would vanish; "
                "make them 0"
            )


def prune(
    w: Any,
    pattern: str | tuple[int, int] | Pattern,
    vec: int,
    layout: str | None = None,
    dtype: DType | str | None = None,
) -> NMMatrix:
    """Prune a dense weight to vector-wise N:M, keeping the largest-L2-norm row vectors.

    ``layout="kn"``: ``w`` is ``K×N`` (``y = x @ w``). ``layout="nk"``: ``w`` is a
    PyTorch ``nn.Linear.weight`` ``[out, in] = [N, K]`` (``y = x @ w.T``); it is
    transposed here so that the result multiplies as ``x @ B`` either way. A PyTorch
    tensor must say which (no default: a square ``[out, in]`` weight taken as ``K×N``
    would multiply as its transpose, without an error); a NumPy or CuPy array is ``K×N``
    unless ``layout`` says otherwise. The values
    keep ``w``'s dtype where it is float32, bfloat16 or float16 (others become float32),
    or take ``dtype``; the norms are computed in float64. Ties go to the lower row.

    Refused, as each would be silently lost or misread otherwise:

    - a PyTorch ``w`` without ``layout``, or a ``layout`` other than ``"kn"`` and ``"nk"``.
    - ``w`` not 2-D, or ``K`` or ``N`` < 1: there is nothing to prune.
    - ``vec`` not a positive integer (a bool included): ``True`` is not a length.
    - ``K`` or ``N`` past 2**31 - 1, or ``vec`` past ``max(N, MAX_VEC_PAST_N)``: the
      kernels index in 32 bits, and a vector past ``N`` holds only zeros (gigabytes of
      them for ``vec=10**9``).
    - a ``pattern`` tuple of non-integers: ``(2.7, 4)`` would be truncated to 2:4.
    - a complex ``w`` (TypeError): the imaginary part would be dropped.
    - a non-numeric ``w`` (bool, object, str; TypeError): not a weight.
    - ``w`` holding NaN or inf: a NaN row would lose to any finite one, an inf be kept.
    - values beyond the range of the values' dtype: they would become inf.
    """
    pat = Pattern.parse(pattern)
    vec = check_vec(vec)
    layout = _layout(layout, w)
    dense = to_numpy(w)
    if dense.ndim != 2:
        raise ValueError(f"weight must be 2-D, got shape {dense.shape}")
    if layout == "nk":
        dense = dense.T
    _check_shape(*dense.shape)
    check_width(vec, dense.shape[1])
    dense = _as_values(dense, dtype, "weight")
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


def reference(a: Any, b: NMMatrix, bias: Any = None,
              activation: Activation | str | None = None) -> Any:
    """``a @ b`` in float64, computed from the compressed form (never densified); with
    ``bias`` (``N`` values) added and ``activation`` applied, in float64 (``nmgen.epilogue``).

    ``a`` is ``M×K`` (NumPy, CuPy or PyTorch). With a CuPy array the product runs on the
    GPU in float64 and a CuPy array comes back; otherwise NumPy.
    """
    if not isinstance(b, NMMatrix):
        raise TypeError(f"b must be an nmgen.NMMatrix (see nmgen.prune), got "
                        f"{type(b).__name__}")
    xp = array_module(a)
    _check_real(a, "a")
    a64 = _float64(a, xp)
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
    out = out[:, : b.shape[1]]
    if bias is not None:
        _check_real(bias, "bias")
        bias = _float64(bias, xp)
        if tuple(bias.shape) != (b.shape[1],):
            raise ValueError(f"bias has shape {tuple(bias.shape)}; b has {b.shape[1]} columns")
    return apply_reference(out, bias, activation)


def _check_real(x: Any, what: str) -> None:
    """Refuse a complex operand: float64 would drop its imaginary part."""
    if (x.is_complex() if is_torch(x) else np.iscomplexobj(x)):
        raise TypeError(f"{what} is complex: the product is real; pass its .real if the "
                        "imaginary part is meant to go")


def _float64(x: Any, xp: Any) -> Any:
    """``x`` (NumPy, CuPy or PyTorch) as a float64 array of ``xp``: on the device where
    ``xp`` is CuPy and ``x`` is there already."""
    if xp is not np:
        if getattr(x, "is_cuda", False):  # a CUDA torch tensor (bfloat16 included)
            return xp.asarray(x.double())
        if array_module(x) is xp:
            return x.astype(xp.float64)
    return xp.asarray(np.asarray(to_numpy(x), dtype=np.float64))
