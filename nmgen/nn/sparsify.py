"""``sparsify(model, pattern, vec)``: replace a model's ``nn.Linear`` layers by
``SparseLinear`` in place, fuse an activation that directly follows one in an
``nn.Sequential`` into its kernels' epilogue, and say what changed (``SparsifySummary``)."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..dispatch import Dispatcher
from ..families.registry import serving
from ..format import DType, Pattern, check_vec
from ..gpus import dense_gemm_ms, spec_or_h100, table_name
from ..problem import ALayout, Problem
from ..runtime.device import DeviceInfo, device_count, device_info, table_device
from ..shapes import MAX_DIM
from .fuse import (
    FusedGroup,
    FusedSlice,
    Groups,
    SkippedGroup,
    check_groups,
    fuse_siblings,
    group_label,
)
from .linear import SparseLinear

# Which layers: a glob on the layer's dotted name, several (any matches), or a predicate.
Selector = str | Iterable[str] | Callable[[str, nn.Module], bool]


@dataclass(frozen=True)
class LayerChange:
    """One replaced layer: its weight and bias before and after, in elements and bytes
    (its ``state_dict``)."""

    name: str
    in_features: int
    out_features: int
    dtype: str
    params_before: int
    params_after: int
    bytes_before: int
    bytes_after: int
    # whether the weight already held the pattern: pruning dropped only zeros (-0.0 among
    # them), every non-zero value kept exactly (a published 2:4 checkpoint)
    already_sparse: bool = False


@dataclass(frozen=True)
class FusedActivation:
    """An activation module now applied by the layer before it (its kernels' epilogue);
    an ``nn.Identity`` stands in its place."""

    layer: str
    module: str
    activation: str


@dataclass(frozen=True)
class SkippedLayer:
    """A selected ``nn.Linear`` that nmgen cannot serve, and why."""

    name: str
    reason: str


@dataclass
class SparsifySummary:
    """What ``sparsify`` did: the layers replaced, those skipped with the reason, and the
    totals over the replaced layers. Parameters are weight and bias elements (the kept
    values after); bytes are those of the layers' state, indices included. ``fused``: the
    activations the replaced layers took into their epilogue; ``fused_groups`` and
    ``unfused_groups``: the sibling groups made one product, and those left apart with the
    reason (``siblings=``)."""

    pattern: str
    vec: int
    replaced: list[LayerChange] = field(default_factory=list)
    skipped: list[SkippedLayer] = field(default_factory=list)
    fused: list[FusedActivation] = field(default_factory=list)
    fused_groups: list[FusedGroup] = field(default_factory=list)
    unfused_groups: list[SkippedGroup] = field(default_factory=list)

    @property
    def params_before(self) -> int:
        return sum(c.params_before for c in self.replaced)

    @property
    def params_after(self) -> int:
        return sum(c.params_after for c in self.replaced)

    @property
    def bytes_before(self) -> int:
        return sum(c.bytes_before for c in self.replaced)

    @property
    def bytes_after(self) -> int:
        return sum(c.bytes_after for c in self.replaced)

    @property
    def bytes_saved(self) -> int:
        return self.bytes_before - self.bytes_after

    @property
    def already_sparse(self) -> int:
        """Replaced layers whose weights already held the pattern (kept exactly)."""
        return sum(c.already_sparse for c in self.replaced)

    @property
    def pruned(self) -> int:
        """Replaced layers whose pruning dropped non-zero values."""
        return len(self.replaced) - self.already_sparse

    def __str__(self) -> str:
        total = len(self.replaced) + len(self.skipped)
        lines = [f"sparsify {self.pattern} L={self.vec}: {len(self.replaced)} of {total} "
                 f"selected Linear layers replaced, {len(self.skipped)} skipped"]
        if self.replaced:
            share = self.params_after / max(self.params_before, 1)
            lines.append(f"  parameters {_count(self.params_before)} -> "
                         f"{_count(self.params_after)} ({share:.1%}); bytes "
                         f"{_size(self.bytes_before)} -> {_size(self.bytes_after)} "
                         f"(saved {_size(self.bytes_saved)})")
            lines.append(f"  {self.already_sparse} already held {self.pattern} (kept exactly), "
                         f"{self.pruned} pruned")
        lines += [f"  fused {f.module} ({f.activation}) into {f.layer}'s epilogue"
                  for f in self.fused]
        lines += [f"  skipped {s.name}: {s.reason}" for s in self.skipped]
        lines += [f"  fused siblings {group_label(g.parent, g.names)} -> {g.holder}"
                  for g in self.fused_groups]
        lines += [f"  siblings not fused {group_label(g.parent, g.names)}: {g.reason}"
                  for g in self.unfused_groups]
        return "\n".join(lines)


def _count(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n >= 1e5 else f"{n:,}"


def _size(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**17 else f"{n:,} B"


# ------------------------------------------------------------------------ selection
def _matcher(selector: Selector | None, default: bool, what: str
             ) -> Callable[[str, nn.Module], bool]:
    if selector is None:
        return lambda name, module: default
    if callable(selector):
        return selector
    globs = [selector] if isinstance(selector, str) else (
        list(selector) if isinstance(selector, Iterable) else None)
    if globs is None or not all(isinstance(g, str) for g in globs):
        raise TypeError(f"{what}={selector!r}: expected a glob of layer names ('*.mlp.*'), "
                        "a list of globs, or a predicate (name, module) -> bool")
    return lambda name, module: any(fnmatch.fnmatchcase(name, g) for g in globs)


def _sparse_already(module: nn.Module) -> bool:
    """A layer ``sparsify`` or ``load_sparse`` made (a fused group's holder aside: its
    slices stand for it)."""
    return type(module) is SparseLinear or isinstance(module, FusedSlice)


def _again(name: str, module: nn.Module, pattern: Pattern, vec: int) -> str:
    """Why a layer sparsified already is skipped; an error where another pattern or L is
    asked: pruning the pruned weight again would keep fewer rows than either choice says."""
    if (module.pattern, module.vec) == (pattern, vec):
        return f"sparsified already ({pattern} L={vec})"
    raise ValueError(f"{name}: sparsified already as {module.pattern} L={module.vec}, not "
                     f"{pattern} L={vec}: sparsify the dense model again (or exclude it); "
                     "pruning the pruned weight would keep neither choice")


def servable(name: str, linear: nn.Module, pattern: Pattern, vec: int,
             parent: nn.Module | None = None, shared: bool = False) -> str | None:
    """``None`` where ``sparsify`` can replace ``linear``; otherwise why not."""
    if type(linear) is not nn.Linear:
        return (f"{type(linear).__name__} is a subclass of nn.Linear, whose forward may do "
                "more than x @ W.T + b")
    if isinstance(parent, nn.MultiheadAttention):
        return "nn.MultiheadAttention reads its weight directly, not through its forward"
    weight = linear.weight
    dtype = DType.of(weight)
    if dtype is None:
        return f"dtype {weight.dtype} (nmgen takes float32, bfloat16 and float16)"
    if weight.device.type not in ("cuda", "cpu"):
        return (f"on the {weight.device.type} device (nmgen runs CUDA tensors, and CPU "
                "ones through its reference)")
    if max(linear.in_features, linear.out_features) > MAX_DIM:
        return f"a dimension above {MAX_DIM} (the kernels index in 32 bits)"
    if shared:
        return "its weight is shared with another module (tied): the dense copy would stay"
    if not serving(Problem(pattern.n, pattern.m, vec, dtype=dtype)):
        return f"no kernel family serves {pattern} L={vec} {dtype.value}"
    return None


def _shared_weights(model: nn.Module) -> set[int]:
    """``id`` of every parameter that more than one module holds."""
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        seen[id(param)] = seen.get(id(param), 0) + 1
    return {key for key, count in seen.items() if count > 1}


# ------------------------------------------------------------------------ speed
class SpeedPredictor:
    """Whether a layer is predicted at least ``min_speedup`` times faster sparse than
    dense at every M of ``batch``: nmgen's time is its dispatch decision's (a tuned record,
    scaled to the shape where it is another shape's, or a family model's estimate) on
    ``gpu``; the dense time a roofline of the GPU's datasheet peaks
    (``nmgen.gpus.dense_gemm_ms``), row-major activations."""

    def __init__(self, min_speedup: float, batch: int | Iterable[int], gpu: str | None):
        if (isinstance(min_speedup, bool) or not isinstance(min_speedup, (int, float))
                or not min_speedup > 0):
            raise ValueError(f"min_speedup={min_speedup!r}: expected a number > 0 (1.0: no "
                             "layer predicted slower than dense)")
        batches = [batch] if isinstance(batch, int) else list(batch)
        if not batches or not all(isinstance(m, int) and not isinstance(m, bool) and m >= 1
                                  for m in batches):
            raise ValueError(f"batch={batch!r}: expected a token count >= 1 or a list of them")
        self.min_speedup, self.batches = float(min_speedup), batches
        self.device = _device_for(gpu)
        self.spec = spec_or_h100(table_name(self.device.name))
        self.dispatcher = Dispatcher(device=self.device)

    def speedups(self, linear: nn.Module, pattern: Pattern, vec: int
                 ) -> list[tuple[int, float, str]]:
        """(M, predicted speedup over dense, the kernel and its evidence) at each M."""
        dtype = DType.of(linear.weight)
        problem = Problem(pattern.n, pattern.m, vec, ALayout.ROW_MAJOR, self.device.arch, dtype)
        out = []
        for rows in self.batches:
            shape = (rows, linear.out_features, linear.in_features)
            decision = self.dispatcher.decide(problem, shape)
            nmgen_ms = decision.at_shape_ms or decision.time_ms
            dense_ms = dense_gemm_ms(self.spec, shape, dtype.itemsize)
            speedup = dense_ms / nmgen_ms if nmgen_ms else 0.0
            out.append((rows, speedup, f"{decision.config.name} ({decision.source})"))
        return out

    def too_slow(self, linear: nn.Module, pattern: Pattern, vec: int) -> str | None:
        """Why ``linear`` stays dense, or ``None``."""
        for rows, speedup, kernel in self.speedups(linear, pattern, vec):
            if speedup < self.min_speedup:
                return (f"predicted {speedup:.2f}x dense at M={rows} on {self.spec.name}, "
                        f"below min_speedup={self.min_speedup:g}: {kernel}")
        return None


def _device_for(gpu: str | None) -> DeviceInfo:
    if gpu is not None:
        return table_device(gpu)
    if device_count() == 0:
        raise ValueError("min_speedup predicts for a GPU and none is present: name one "
                         "(gpu='h100', 'h200', 'a100', ...)")
    return device_info()


# ------------------------------------------------------------------------ sparsify
def sparsify(model: nn.Module, pattern: str | tuple[int, int] | Pattern, vec: int, *,
             include: Selector | None = None, exclude: Selector | None = None,
             fuse: bool = True, siblings: Groups | None = None,
             compiled_inputs_unchanged: bool = False, min_speedup: float | None = None,
             batch: int | Iterable[int] = 1, gpu: str | None = None) -> SparsifySummary:
    """Replace, in place, every ``nn.Linear`` of ``model`` whose dotted name matches
    ``include`` (default: all) and not ``exclude`` by ``SparseLinear.from_dense(linear,
    pattern, vec)``. A selector is a glob (``"*.mlp.*"``), a list of globs, or a
    predicate ``(name, module) -> bool``. Layers nmgen cannot serve (dtype, device, size,
    a tied or directly read weight, an ``nn.Linear`` subclass, non-finite values) are
    left as they are and listed in the summary with the reason. With ``fuse``, an
    activation module that directly follows a replaced layer in an ``nn.Sequential``
    (``fuse_activations``) becomes part of the layer. With ``siblings`` (groups of child
    names, e.g. ``nmgen.nn.LLAMA_SIBLINGS``), each group of replaced layers of one parent
    that read the same input becomes one product (``fuse_siblings``; off by default: the
    layers become ``FusedSlice`` modules whose outputs are views, and it pays only where
    the model calls them on the same tensor; ``compiled_inputs_unchanged`` as there).
    With ``min_speedup`` (off by default), a layer stays dense where nmgen's best known
    kernel is predicted slower than ``min_speedup`` times the dense product at any of the
    ``batch`` token counts (M), the summary naming the prediction (``SpeedPredictor``);
    ``gpu`` (a GPU table name, e.g. ``"h100"``) is the GPU predicted for, by default the
    one present."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    pat = Pattern.parse(pattern)
    vec = check_vec(vec)
    wanted, unwanted = _matcher(include, True, "include"), _matcher(exclude, False, "exclude")
    if siblings is not None:
        siblings = check_groups(siblings)
    summary = SparsifySummary(str(pat), vec)
    predictor = None if min_speedup is None else SpeedPredictor(min_speedup, batch, gpu)
    shared = _shared_weights(model)
    parents = dict(model.named_modules())
    layers = [(name, module) for name, module in model.named_modules()
              if isinstance(module, nn.Linear) or _sparse_already(module)]
    chosen = [(name, module) for name, module in layers if wanted(name, module)]
    if include is not None and not chosen:
        raise ValueError(f"include={include!r} matches none of the model's "
                         f"{len(layers)} Linear layers (e.g. "
                         f"{', '.join(n for n, _ in layers[:3]) or 'none'})")
    for name, module in chosen:
        if unwanted(name, module):
            continue
        if _sparse_already(module):
            summary.skipped.append(SkippedLayer(name, _again(name, module, pat, vec)))
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = parents.get(parent_name) if name else None
        reason = ("the model itself is the Linear: use SparseLinear.from_dense"
                  if parent is None else
                  servable(name, module, pat, vec, parent, id(module.weight) in shared))
        if reason is None and predictor is not None:
            reason = predictor.too_slow(module, pat, vec)
        if reason is None:
            reason = _replace(summary, parent, attr, name, module, pat, vec)
        if reason is not None:
            summary.skipped.append(SkippedLayer(name, reason))
    if fuse:
        summary.fused = fuse_activations(model, {c.name for c in summary.replaced})
    if siblings is not None:
        fused = fuse_siblings(model, siblings,
                              compiled_inputs_unchanged=compiled_inputs_unchanged)
        summary.fused_groups, summary.unfused_groups = fused.fused, fused.skipped
    return summary


# ------------------------------------------------------------------------ fusion
def activation_of(module: nn.Module) -> str | None:
    """The epilogue activation that ``module`` computes, or ``None`` (exact types only: a
    subclass may do more)."""
    if type(module) is nn.ReLU:
        return "relu"
    if type(module) is nn.SiLU:
        return "silu"
    if type(module) is nn.GELU:
        return "gelu" if module.approximate == "none" else "gelu_tanh"
    return None


def fuse_activations(model: nn.Module, layers: set[str]) -> list[FusedActivation]:
    """In every ``nn.Sequential`` of ``model`` (exactly that type: its forward feeds each
    module's output to the next alone), a ``SparseLinear`` named in ``layers`` with no
    activation, followed directly by a module ``activation_of`` knows, takes that
    activation; an ``nn.Identity`` takes the module's place. Modules with forward hooks are
    left alone (a hook would see another tensor)."""
    fused = []
    sequentials = [(name, module) for name, module in model.named_modules()
                   if type(module) is nn.Sequential]
    for prefix, sequential in sequentials:
        keys = list(sequential._modules)
        for first, second in zip(keys[:-1], keys[1:], strict=True):
            layer, module = sequential._modules[first], sequential._modules[second]
            name = f"{prefix}.{first}" if prefix else first
            activation = activation_of(module) if module is not None else None
            if (not isinstance(layer, SparseLinear) or name not in layers
                    or layer.activation != "none" or activation is None
                    or _hooked(layer) or _hooked(module)):
                continue
            layer.activation = activation
            sequential._modules[second] = nn.Identity()
            fused.append(FusedActivation(name, f"{prefix}.{second}" if prefix else second,
                                         activation))
    return fused


def _hooked(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def _replace(summary: SparsifySummary, parent: nn.Module, attr: str, name: str,
             linear: nn.Linear, pattern: Pattern, vec: int) -> str | None:
    """Put ``linear``'s sparse form in its place and record it; the reason where pruning
    refuses the weight."""
    try:
        layer = SparseLinear.from_dense(linear, pattern, vec, name=name)
    except (ValueError, TypeError) as exc:
        return str(exc)
    setattr(parent, attr, layer)
    bias = linear.out_features if linear.bias is not None else 0
    summary.replaced.append(LayerChange(
        name, linear.in_features, linear.out_features, str(linear.weight.dtype)
        .removeprefix("torch."), linear.weight.numel() + bias, layer.values.numel() + bias,
        _bytes(linear.weight) + (_bytes(linear.bias) if linear.bias is not None else 0),
        layer.state_bytes(), _non_zeros(linear.weight) == _non_zeros(layer.values)))
    return None


def _non_zeros(tensor: torch.Tensor) -> int:
    """Non-zero elements (-0.0 is zero)."""
    return int(torch.count_nonzero(tensor.detach()))


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
