"""``SparseLinear``: an ``nn.Linear`` whose weight is pruned to vector-wise N:M and kept
compressed, optionally followed by an activation in the same kernel; its forward is the
``nmgen::nm_linear`` op."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ..epilogue import Activation
from ..format import MAX_INDEX, DType, NMMatrix, Pattern, check_vec, check_width, prune
from . import ops

TORCH_DTYPES = {DType.F32: torch.float32, DType.BF16: torch.bfloat16, DType.F16: torch.float16}


def torch_dtype_of(dtype: DType) -> torch.dtype:
    return TORCH_DTYPES[dtype]


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor holding a copy of ``array`` (bfloat16 arrays by their bits)."""
    if DType.of(array) is DType.BF16:
        return torch.from_numpy(np.array(array).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(array))


def _check_features(in_features: int, out_features: int) -> None:
    """Both counts integers in ``[1, MAX_INDEX]`` (the kernels index in 32 bits)."""
    for what, count in (("in_features", in_features), ("out_features", out_features)):
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
            raise TypeError(f"{what} = {count!r}: expected an integer")
        if not 1 <= count <= MAX_INDEX:
            raise ValueError(f"{what} = {count}: must be in [1, {MAX_INDEX}] (the kernels "
                             "index in 32 bits)")


def _check_finite_bias(bias: torch.Tensor, title: str) -> None:
    bad = bias.numel() - int(torch.isfinite(bias).sum())
    if bad:
        raise ValueError(f"{title}: the bias holds {bad} non-finite values (NaN or inf): "
                         "every output they touch would be too")


def unreadable(values: Any, indices: Any, bias: Any) -> str | None:
    """Why a layer's state cannot be loaded (even with ``strict=False``, which would keep
    the layer's own tensor in place of the one missing): values without their indices or
    the other way round, or a non-finite bias; ``None`` where it can."""
    if (values is None) != (indices is None):
        given, lost = ("values", "indices") if indices is None else ("indices", "values")
        return (f"the state holds {given} without {lost}: neither means anything without "
                "the other (strict=False would pair it with the layer's own)")
    if bias is not None and torch.is_tensor(bias):
        try:
            _check_finite_bias(bias, "the state")
        except ValueError as exc:
            return str(exc)
    return None


class SparseLinear(nn.Module):
    """``y = activation(x @ W.T + bias)`` for ``x`` of shape ``(..., in_features)``, with
    ``W`` (``out_features × in_features``) pruned to vector-wise ``n:m`` with vector length
    ``L`` (``vec``) along the output features, kept compressed. ``activation``: ``"none"``
    (an ``nn.Linear``), ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"silu"``; on CUDA the
    bias and the activation are the kernel's epilogue (``sparsify`` fuses an activation
    module that directly follows the layer in an ``nn.Sequential``).

    Its state is buffers (no trainable parameters): ``values`` (``W×out``, the layer's
    dtype), ``indices`` (``W×⌈out/L⌉`` uint8), ``nm_meta`` (int64 ``[n, m, L, in, out]``)
    and ``bias`` (``out`` or ``None``), with ``W = ⌈in/m⌉·n``. On CUDA the product runs
    through ``nmgen.dispatch``, on CPU through the float32 reference. Inference only: a
    forward whose input requires a gradient under grad mode raises ``RuntimeError``.
    """

    def __init__(self, in_features: int, out_features: int,
                 pattern: str | tuple[int, int] | Pattern, vec: int, *, bias: bool = True,
                 dtype: torch.dtype | None = None, device: Any = None, name: str = "",
                 activation: str = "none"):
        """An all-zero layer of this shape (``load_state_dict`` or ``from_dense`` fills
        it). ``name``: how errors name the layer (``sparsify`` sets its path)."""
        super().__init__()
        pat = Pattern.parse(pattern)
        vec = check_vec(vec)
        _check_features(in_features, out_features)
        in_features, out_features = int(in_features), int(out_features)
        check_width(vec, out_features)
        dtype = dtype or torch.get_default_dtype()
        if dtype not in TORCH_DTYPES.values():
            raise TypeError(f"dtype {dtype}: nmgen takes torch.float32, torch.bfloat16 and "
                            "torch.float16")
        self.in_features, self.out_features = in_features, out_features
        self.pattern, self.vec, self.name = pat, vec, name
        self.activation = activation
        rows = -(-in_features // pat.m) * pat.n
        groups = -(-out_features // vec)
        kept = torch.arange(pat.n, dtype=torch.uint8, device=device).repeat(rows // pat.n)
        self.register_buffer("values", torch.zeros((rows, out_features), dtype=dtype,
                                                   device=device))
        self.register_buffer("indices", kept[:, None].expand(rows, groups).contiguous())
        self.register_buffer("nm_meta", torch.tensor(self.meta, dtype=torch.int64,
                                                     device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device)
                             if bias else None)
        self._matrix: NMMatrix | None = None

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_dense(cls, linear: nn.Linear, pattern: str | tuple[int, int] | Pattern,
                   vec: int, *, name: str = "", activation: str = "none") -> SparseLinear:
        """``linear`` pruned with ``nmgen.prune`` (the largest-L2-norm rows of every
        ``m``-window, the same for ``vec`` consecutive output features), on its device, in
        its dtype (float32, bfloat16 or float16), with its bias; then ``activation``."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"{name or 'from_dense'}: expected an nn.Linear, got "
                            f"{type(linear).__name__}")
        weight = linear.weight.detach()
        if linear.bias is not None:
            _check_finite_bias(linear.bias.detach(), name or "the layer")
        if DType.of(weight) is None:
            raise TypeError(f"{name or 'the layer'}: weight is {weight.dtype}; nmgen takes "
                            "torch.float32, torch.bfloat16 and torch.float16")
        matrix = prune(weight, pattern, vec, layout="nk")
        layer = cls(linear.in_features, linear.out_features, matrix.pattern, matrix.vec,
                    bias=linear.bias is not None, dtype=weight.dtype, device=weight.device,
                    name=name, activation=activation)
        with torch.no_grad():
            layer.set_matrix(matrix)
            if linear.bias is not None:
                layer.bias.copy_(linear.bias.detach())
        return layer

    def set_matrix(self, matrix: NMMatrix) -> None:
        """Take ``matrix`` (``in×out``, this layer's pattern, L and dtype) as the weight."""
        if not isinstance(matrix, NMMatrix):
            raise TypeError(f"{self._title()}: expected an nmgen.NMMatrix (nmgen.prune(w, ..., "
                            f"layout='nk') of an [out, in] weight), got {type(matrix).__name__}")
        want = (self.pattern, self.vec, (self.in_features, self.out_features))
        if (matrix.pattern, matrix.vec, matrix.shape) != want:
            raise ValueError(f"{self._title()}: matrix is {matrix.shape} {matrix.pattern} "
                             f"L={matrix.vec}; the layer is {want[2]} {want[0]} L={want[1]}")
        if torch_dtype_of(matrix.dtype) != self.values.dtype:
            raise TypeError(f"{self._title()}: matrix holds {matrix.dtype.value} values; "
                            f"the layer is {self.values.dtype}")
        device = self.values.device
        self.values = _from_numpy(matrix.values).to(device)
        self.indices = _from_numpy(matrix.indices).to(device)
        self._matrix = matrix
        self._remember()

    # ---------------------------------------------------------------- views
    @property
    def activation(self) -> str:
        """What follows the product and the bias: ``"none"`` or an activation's name."""
        return self._activation.value

    @activation.setter
    def activation(self, value: str) -> None:
        try:
            self._activation = Activation.parse(value)
        except ValueError as exc:
            raise ValueError(f"{self._title()}: {exc}") from None

    @property
    def meta(self) -> tuple[int, int, int, int, int]:
        """``(n, m, L, in_features, out_features)``, as ``nm_meta`` holds them."""
        return (self.pattern.n, self.pattern.m, self.vec, self.in_features,
                self.out_features)

    @property
    def matrix(self) -> NMMatrix:
        """The weight as an ``NMMatrix`` (``B = W.T``, ``in×out``), on the host."""
        if self._matrix is None or torch_dtype_of(self._matrix.dtype) != self.values.dtype:
            self._matrix = NMMatrix.from_compressed(
                self.values, self.indices, self.pattern, self.vec,
                (self.in_features, self.out_features), layout="kn")
        return self._matrix

    def dense_weight(self) -> torch.Tensor:
        """The pruned weight ``W`` (``out×in``, zeros where pruned), dense, in the layer's
        dtype and on its device."""
        n, m, vec, k, _ = self.meta
        return ops.to_dense(self.values, self.indices, n, m, vec, k).T.contiguous()

    def to_linear(self) -> nn.Linear:
        """An ``nn.Linear`` holding the pruned weight densely (a reference to compare with;
        the layer's activation is not part of it)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           dtype=self.values.dtype, device=self.values.device)
        with torch.no_grad():
            linear.weight.copy_(self.dense_weight())
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear.requires_grad_(False)

    def state_bytes(self) -> int:
        """Bytes of the layer's state (``state_dict``)."""
        return sum(t.numel() * t.element_size() for t in self.state_dict().values())

    def extra_repr(self) -> str:
        act = "" if self.activation == "none" else f", activation={self.activation}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"pattern={self.pattern}, vec={self.vec}, bias={self.bias is not None}{act}")

    def _title(self) -> str:
        return f"SparseLinear {self.name!r}" if self.name else "SparseLinear"

    # ---------------------------------------------------------------- the product
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError(
                f"{self._title()} ({self.in_features}→{self.out_features}, {self.pattern} "
                f"L={self.vec}) is inference-only and has no gradient: run the model under "
                "torch.no_grad() or torch.inference_mode()")
        n, m, vec, k, _ = self.meta
        return torch.ops.nmgen.nm_linear(x, self.values, self.indices, self.bias, n, m, vec, k,
                                         self.activation)

    # ---------------------------------------------------------------- keeping the matrix
    def _remember(self) -> None:
        """Hand the host matrix to the op for this layer's CUDA tensors (so that its first
        call copies nothing back)."""
        if self.values.device.type != "cuda":
            return
        n, m, vec, k, _ = self.meta
        self._matrix = ops.remember(self.values, self.indices, n, m, vec, k, self.matrix)

    def _apply(self, fn: Any, recurse: bool = True) -> SparseLinear:
        result = super()._apply(fn, recurse)
        self._remember()  # new tensors (another device or dtype)
        return result

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              local_metadata: dict, strict: bool, missing_keys: list[str],
                              unexpected_keys: list[str], error_msgs: list[str]) -> None:
        """Refuse a state of another pattern, L or shape, and values or indices that are
        not a valid N:M matrix; after loading, the matrix is built from the loaded values."""
        meta = state_dict.get(prefix + "nm_meta")
        if meta is not None and tuple(int(v) for v in meta.tolist()) != self.meta:
            error_msgs.append(
                f"{prefix or 'the layer'}: the state holds (n, m, L, in, out) = "
                f"{tuple(meta.tolist())}, the layer is {self.meta} (nmgen.nn.load_sparse "
                "builds layers from the state)")
            return
        values, indices = state_dict.get(prefix + "values"), state_dict.get(prefix + "indices")
        reason = unreadable(values, indices, state_dict.get(prefix + "bias"))
        if reason is not None:
            error_msgs.append(f"{prefix or 'the layer'}: {reason}")
            return
        matrix = None
        if values is not None and indices is not None:
            try:
                matrix = NMMatrix.from_compressed(values, indices, self.pattern, self.vec,
                                                  (self.in_features, self.out_features),
                                                  layout="kn")
            except (ValueError, TypeError) as exc:
                error_msgs.append(f"{prefix or 'the layer'}: {exc}")
                return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                      missing_keys, unexpected_keys, error_msgs)
        self._matrix = matrix  # None (missing keys): built from the buffers when needed
        self._remember()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_matrix"] = None  # device layouts do not copy; rebuilt from the buffers
        return state
