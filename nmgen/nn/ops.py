"""The custom op ``nmgen::nm_linear(x, values, indices, bias, n, m, vec, k, activation)``:
``activation(x @ W.T + bias)`` where ``W`` (``N×K``, an ``nn.Linear`` weight) is held in
nmgen's vector-wise N:M form of ``B = W.T`` (``nmgen.format``): ``values`` ``W×N`` in the
activations' dtype and ``indices`` ``W×⌈N/L⌉`` uint8, with ``W = ⌈K/m⌉·n``. ``x`` is
``(..., K)``; the output is ``(..., N)`` in ``x``'s dtype. ``bias`` is optional;
``activation`` is ``"none"`` (the default), ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or
``"silu"``.

- CUDA: ``nmgen.dispatch`` on torch's current stream, into an output that torch allocates
  (inside a CUDA graph capture, from the graph's pool); the bias and the activation are the
  kernel's epilogue, on its FP32 sums before their one rounding to ``x``'s dtype.
- CPU: the reference path: the weight decompressed to a dense float32 matrix, the product,
  the bias and the activation in float32, cast back to ``x``'s dtype.
- Fake (meta): the output's shape and dtype, so ``torch.compile`` traces the op whole.

A CUDA call needs the weight as an ``NMMatrix`` (the kernels read their own layout of it,
made once per device). It is built once per ``(values, indices)`` pair, kept while the
``values`` tensor object lives, keyed on the tensors' addresses and checked against their
version counters (an in-place change, as ``load_state_dict`` makes, builds it again).
Building it copies the weight to the host, so a first call, or one after a change, must be
made outside CUDA graph capture; ``SparseLinear`` hands its matrix over up front.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import torch

from ..dispatch import dispatch
from ..epilogue import Activation
from ..format import NMMatrix, Pattern

OP_NAME = "nmgen::nm_linear"
SCHEMA = ("(Tensor x, Tensor values, Tensor indices, Tensor? bias, int n, int m, int vec, "
          "int k, str activation=\"none\") -> Tensor")
# The activations in float32 on the CPU path, as torch computes them.
_ACTIVATIONS = {
    Activation.NONE: lambda x: x,
    Activation.RELU: torch.relu,
    Activation.GELU: torch.nn.functional.gelu,
    Activation.GELU_TANH: lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    Activation.SILU: torch.nn.functional.silu,
}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------ checks
def check_call(x: torch.Tensor, values: torch.Tensor, indices: torch.Tensor,
               bias: torch.Tensor | None, n: int, m: int, vec: int, k: int,
               activation: str = "none") -> Activation:
    """Refuse operands that do not line up (shapes, dtypes and devices only: no sync);
    the activation asked for."""
    Pattern(n, m)
    try:
        act = Activation.parse(activation)
    except ValueError as exc:
        raise ValueError(f"{OP_NAME}: {exc}") from None
    if vec < 1 or k < 1:
        raise ValueError(f"{OP_NAME}: vec = {vec} and K = {k} must be >= 1")
    if values.dim() != 2 or indices.dim() != 2:
        raise ValueError(f"{OP_NAME}: values and indices must be 2-D, got "
                         f"{tuple(values.shape)} and {tuple(indices.shape)}")
    rows, cols = values.shape
    if rows != _ceil_div(k, m) * n:
        raise ValueError(f"{OP_NAME}: values has {rows} rows; {n}:{m} with K = {k} needs "
                         f"{_ceil_div(k, m) * n}")
    if tuple(indices.shape) != (rows, _ceil_div(cols, vec)) or indices.dtype != torch.uint8:
        raise ValueError(f"{OP_NAME}: indices is {tuple(indices.shape)} {indices.dtype}; "
                         f"needs ({rows}, {_ceil_div(cols, vec)}) torch.uint8")
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"{OP_NAME}: x has shape {tuple(x.shape)}; its last dimension "
                         f"must be K = {k}")
    if x.dtype != values.dtype:
        raise TypeError(f"{OP_NAME}: x is {x.dtype} but the weight is {values.dtype}: pass "
                        "activations in the layer's dtype")
    if bias is not None and (tuple(bias.shape) != (cols,) or bias.dtype != x.dtype):
        raise ValueError(f"{OP_NAME}: bias is {tuple(bias.shape)} {bias.dtype}; needs "
                         f"({cols},) {x.dtype}")
    devices = {t.device for t in (x, values, indices, bias) if t is not None}
    if len(devices) > 1:
        raise ValueError(f"{OP_NAME}: operands on several devices: "
                         f"{', '.join(sorted(map(str, devices)))}")
    return act


# ------------------------------------------------------------------------ the weight
def to_dense(values: torch.Tensor, indices: torch.Tensor, n: int, m: int, vec: int,
             k: int) -> torch.Tensor:
    """The ``K×N`` matrix ``B`` (zeros where pruned) in ``values``' dtype and device; its
    transpose is the pruned ``nn.Linear`` weight."""
    rows, cols = values.shape
    window = torch.arange(rows, device=values.device) // n * m
    kept = window[:, None] + indices.long()  # W×G: the dense row of each kept row
    kept = kept.repeat_interleave(vec, dim=1)[:, :cols]  # W×N
    dense = values.new_zeros((rows // n * m, cols))
    return dense.scatter_(0, kept, values)[:k]


@dataclass(eq=False)
class _Entry:
    matrix: NMMatrix
    versions: tuple[int, int]


_ENTRIES: dict[tuple, _Entry] = {}
_LOCK = threading.Lock()


def _key(values: torch.Tensor, indices: torch.Tensor, n: int, m: int, vec: int,
         k: int) -> tuple:
    return (values.device, values.data_ptr(), indices.data_ptr(), values.dtype,
            tuple(values.shape), n, m, vec, k)


def _versions(values: torch.Tensor, indices: torch.Tensor) -> tuple[int, int]:
    try:
        return values._version, indices._version
    except RuntimeError:  # inference tensors keep no version counter (and cannot change)
        return -1, -1


def remember(values: torch.Tensor, indices: torch.Tensor, n: int, m: int, vec: int, k: int,
             matrix: NMMatrix | None = None) -> NMMatrix:
    """The ``NMMatrix`` of ``(values, indices)`` for CUDA calls: ``matrix`` where given (it
    must hold the same weight), else built from the tensors (a copy to the host, validated).
    Kept while the ``values`` tensor object lives."""
    if matrix is None:
        matrix = NMMatrix.from_compressed(values, indices, (n, m), vec, (k, values.shape[1]),
                                          layout="kn")
    key = _key(values, indices, n, m, vec, k)
    entry = _Entry(matrix, _versions(values, indices))
    with _LOCK:
        _ENTRIES[key] = entry
    weakref.finalize(values, _forget, key, entry)
    return matrix


def _forget(key: tuple, entry: _Entry) -> None:
    with _LOCK:
        if _ENTRIES.get(key) is entry:
            del _ENTRIES[key]


def matrix_of(values: torch.Tensor, indices: torch.Tensor, n: int, m: int, vec: int,
              k: int) -> NMMatrix:
    """The weight's ``NMMatrix``: the one remembered for these tensors, else a new one
    (refused while the current stream is capturing a CUDA graph)."""
    entry = _ENTRIES.get(_key(values, indices, n, m, vec, k))
    if entry is not None and entry.versions == _versions(values, indices):
        return entry.matrix
    if values.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{OP_NAME}: a weight not seen before (or changed in place) reached a CUDA "
            "graph capture; building it copies it to the host, which cannot be captured: "
            "run the model once before capturing")
    return remember(values, indices, n, m, vec, k)


# ------------------------------------------------------------------------ the op
@torch.library.custom_op(OP_NAME, mutates_args=(), schema=SCHEMA)
def nm_linear(x: torch.Tensor, values: torch.Tensor, indices: torch.Tensor,
              bias: torch.Tensor | None, n: int, m: int, vec: int, k: int,
              activation: str = "none") -> torch.Tensor:
    """``activation(x @ W.T + bias)`` with ``W`` in vector-wise N:M form (see the module
    docstring)."""
    raise NotImplementedError(f"{OP_NAME} runs on CUDA and CPU tensors, not {x.device}")


@nm_linear.register_kernel("cpu")
def _cpu(x: torch.Tensor, values: torch.Tensor, indices: torch.Tensor,
         bias: torch.Tensor | None, n: int, m: int, vec: int, k: int,
         activation: str = "none") -> torch.Tensor:
    act = check_call(x, values, indices, bias, n, m, vec, k, activation)
    dense = to_dense(values, indices, n, m, vec, k).float()
    out = x.reshape(-1, k).float() @ dense
    if bias is not None:
        out += bias.float()
    out = _ACTIVATIONS[act](out)
    return out.to(x.dtype).view(*x.shape[:-1], values.shape[1])


@nm_linear.register_kernel("cuda")
def _cuda(x: torch.Tensor, values: torch.Tensor, indices: torch.Tensor,
          bias: torch.Tensor | None, n: int, m: int, vec: int, k: int,
          activation: str = "none") -> torch.Tensor:
    act = check_call(x, values, indices, bias, n, m, vec, k, activation)
    matrix = matrix_of(values, indices, n, m, vec, k)
    rows = _rows(x, k)
    out = torch.empty((rows.shape[0], values.shape[1]), dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        epilogue = {"bias": None if bias is None else bias.contiguous(),
                    "activation": None if act is Activation.NONE else act}
        if x.device.index != torch.cuda.current_device():
            with torch.cuda.device(x.device):
                dispatch(rows, matrix, out=out, **epilogue)
        else:
            dispatch(rows, matrix, out=out, **epilogue)  # on torch's current stream
    return out.view(*x.shape[:-1], values.shape[1])


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x`` as ``M×K``: a view where it is row-major or K-major (both of which the
    kernels read), else a row-major copy."""
    rows = x.reshape(-1, k)
    count = rows.shape[0]
    row_major = rows.stride(1) == 1 and rows.stride(0) >= k
    k_major = count > 1 and k > 1 and rows.stride(0) == 1 and rows.stride(1) >= count
    if row_major or k_major:
        return rows
    return torch.empty((count, k), dtype=x.dtype, device=x.device).copy_(rows)


@nm_linear.register_fake
def _fake(x: torch.Tensor, values: torch.Tensor, indices: torch.Tensor,
          bias: torch.Tensor | None, n: int, m: int, vec: int, k: int,
          activation: str = "none") -> torch.Tensor:
    check_call(x, values, indices, bias, n, m, vec, k, activation)
    return x.new_empty((*x.shape[:-1], values.shape[1]))


def _setup_context(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
    return None


def _backward(ctx: object, grad: torch.Tensor) -> tuple:
    raise RuntimeError(f"{OP_NAME} is inference-only: it has no backward. Run the model "
                       "under torch.no_grad() or torch.inference_mode()")


nm_linear.register_autograd(_backward, setup_context=_setup_context)
