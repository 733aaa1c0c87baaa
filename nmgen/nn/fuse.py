"""Sibling fusion: ``SparseLinear`` layers of one parent that read the same input (Llama's
``q_proj``, ``k_proj``, ``v_proj``; ``gate_proj``, ``up_proj``) computed as ONE sparse
product over their concatenated output features, each layer then taking its slice.

``fuse_siblings(model, groups)`` puts, in every parent holding all of a group's layers
(same ``in_features``, pattern, L, dtype, activation, device, bias presence; the output
features of all but the last a multiple of L, so that the compressed columns and their
index groups concatenate), a ``FusedLinear`` (the product over the concatenated weight)
beside them and a ``FusedSlice`` in each layer's place.

How one product serves the group: the first slice called with an input ``x`` runs the
fused product and the holder keeps ``(x, key, out)``; a slice of the group called later
with the same tensor object, unchanged since, returns its columns of ``out``; once every
slice has taken its columns (or the parent's forward ends: a forward hook) the holder
drops them, so no tensor outlives the forward. Anything else (another input, a slice
called twice, an input changed in place) computes afresh: slower, never stale.

"Unchanged since" is checked eagerly by the version counters of ``x`` and of the fused
weight; under ``torch.compile`` by ``x.data_ptr()``, which dynamo decides at trace time
(the same traced tensor at the same fake version), so that the graph holds one
``nmgen::nm_linear`` per group. Where dynamo cannot prove it (``x`` changed in place
between the siblings, or a graph break between them) torch.compile raises rather than
break the graph there (see ``_traced_check``). A dynamo that cannot decide ``data_ptr``
comparisons (torch before 2.13) leaves each slice its own columns under
``torch.compile``: the unfused cost, never an error; unless the caller promises that no
parent changes a group's input in place between its siblings' calls
(``compiled_inputs_unchanged``, true of transformers' Llama attention and MLP), in which
case the slices share one product there by the input's identity alone. An input without
a version counter (an inference tensor, eager ``torch.inference_mode``) cannot be checked:
each slice then runs its own columns of the fused weight (the unfused cost).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..format import NMMatrix
from .linear import SparseLinear, unreadable

# Llama-family projections that read the same input (attention and MLP).
LLAMA_SIBLINGS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"),
                                               ("gate_proj", "up_proj"))
Groups = Iterable[Sequence[str]]


@dataclass(frozen=True)
class FusedGroup:
    """Sibling layers of ``parent`` now one product (``holder``, a ``FusedLinear``)."""

    parent: str
    names: tuple[str, ...]
    holder: str
    out_features: tuple[int, ...]


@dataclass(frozen=True)
class SkippedGroup:
    """Siblings of ``parent`` left unfused, and why."""

    parent: str
    names: tuple[str, ...]
    reason: str


@dataclass
class FuseSummary:
    """What ``fuse_siblings`` did: the groups fused, those skipped with the reason."""

    fused: list[FusedGroup]
    skipped: list[SkippedGroup]

    def __str__(self) -> str:
        lines = [f"fuse_siblings: {len(self.fused)} groups fused, {len(self.skipped)} skipped"]
        lines += [f"  fused {group_label(g.parent, g.names)} -> {g.holder}" for g in self.fused]
        lines += [f"  not fused {group_label(s.parent, s.names)}: {s.reason}"
                  for s in self.skipped]
        return "\n".join(lines)


def group_label(parent: str, names: Sequence[str]) -> str:
    return f"{parent + '.' if parent else ''}{{{', '.join(names)}}}"


def _version(t: torch.Tensor | None) -> int | None:
    if t is None:
        return 0
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version counter
        return None


def _traced_check() -> Any:
    """``same(ptr, x)``: whether ``ptr``, taken by ``x.data_ptr()`` earlier in the trace,
    is that of ``x`` unchanged. Dynamo decides the comparison at trace time: equal where
    ``x`` is the same traced tensor at the same (fake) version. Where it cannot prove it
    (``x`` changed in place since; or the key was kept across a graph break, where it
    is a plain integer that an in-place change leaves equal) the comparison would be a
    graph break, after which it would run eagerly on integers and could say equal:
    ``error_on_graph_break`` makes that an error instead. ``None`` where this torch's
    dynamo cannot decide a ``data_ptr`` comparison (before torch 2.13 it raises
    ``Unsupported`` at any) or has no ``error_on_graph_break``: siblings then run apart
    under ``torch.compile``."""
    no_break = getattr(torch._dynamo, "error_on_graph_break", None)
    if no_break is None or not _dynamo_compares_data_ptrs():
        return None

    @no_break(True)
    def same(ptr: int, x: torch.Tensor) -> bool:
        return ptr == x.data_ptr() and torch.compiler.is_compiling()

    return same


def _dynamo_compares_data_ptrs() -> bool:
    """Whether dynamo proves two ``data_ptr()`` of one traced tensor equal (torch 2.13's
    ``DataPtrVariable`` does; torch 2.11's raises ``Unsupported`` at the comparison)."""
    try:
        from torch._dynamo.variables.tensor import DataPtrVariable
    except ImportError:
        return False
    return hasattr(DataPtrVariable, "_is_same_data_ptr")


_same_traced = _traced_check()


class FusedLinear(SparseLinear):
    """The product of a sibling group: a ``SparseLinear`` over the concatenated output
    features, whose buffers are not part of the state (each ``FusedSlice`` saves and
    loads its own columns, so a fused model's ``state_dict`` is the unfused one's). Its
    ``FusedSlice`` layers call ``output(x, slot)``."""

    def __init__(self, *args: Any, bounds: Sequence[tuple[int, int]] = (),
                 compiled_inputs_unchanged: bool = False, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._non_persistent_buffers_set.update(("values", "indices", "nm_meta", "bias"))
        self.bounds = tuple(bounds)  # each slot's output columns [start, stop)
        # shared by identity alone while compiling where dynamo cannot compare data_ptrs
        self.compiled_inputs_unchanged = compiled_inputs_unchanged
        self._cache: tuple | None = None
        self._views: tuple = (None, {})

    def extra_repr(self) -> str:
        return super().extra_repr() + f", slices={list(self.bounds)}"

    # ---------------------------------------------------------------- the shared product
    def output(self, x: torch.Tensor, slot: int) -> torch.Tensor:
        """Slice ``slot``'s columns of the fused product of ``x``: of the kept product
        where ``x`` is the tensor it was computed from, unchanged, and ``slot`` has not
        taken its columns yet; else of a product computed afresh (and kept for the other
        slices)."""
        start, stop = self.bounds[slot]
        full, bit = (1 << len(self.bounds)) - 1, 1 << slot
        if torch.compiler.is_compiling():
            if _same_traced is not None:
                key: tuple = ("compiled", x.data_ptr())
            elif self.compiled_inputs_unchanged:  # the caller's promise: identity suffices
                key = ("identity",)
            else:  # no way to check it while tracing: no sharing
                return self._own(x, slot)
        else:
            key = self._eager_key(x)
            if key is None:  # no version counter: an in-place change would be invisible
                return self._own(x, slot)
        cache = self._cache
        if cache is not None and cache[0] is x and not cache[3] & bit and self._fresh(
                cache[1], x):
            taken = cache[3] | bit
            self._cache = None if taken == full else (cache[0], cache[1], cache[2], taken)
            return cache[2][..., start:stop]
        out = self(x)
        self._cache = None if full == bit else (x, key, out, bit)
        return out[..., start:stop]

    def _eager_key(self, x: torch.Tensor) -> tuple | None:
        version = _version(x)
        if version is None:
            return None
        return ("eager", version, _version(self.values), _version(self.indices),
                _version(self.bias))

    def _fresh(self, key: tuple, x: torch.Tensor) -> bool:
        """Whether the product kept under ``key`` is that of ``x`` as it is now."""
        if key[0] == "compiled":
            return _same_traced(key[1], x)
        if key[0] == "identity":  # the identity was checked by the caller
            return torch.compiler.is_compiling()
        return not torch.compiler.is_compiling() and key == self._eager_key(x)

    def drop(self, *args: Any) -> None:
        """Forget the kept product (the parent's forward hook calls this)."""
        self._cache = None

    def _own(self, x: torch.Tensor, slot: int) -> torch.Tensor:
        """Slice ``slot`` alone, through views of the fused buffers (kept while the
        buffers are, so that the op builds their device layout once)."""
        base, views = self._views
        if base is not self.values:
            base, views = self.values, {}
            self._views = (base, views)
        if slot not in views:
            start, stop = self.bounds[slot]
            groups = slice(start // self.vec, -(-stop // self.vec))
            views[slot] = (self.values[:, start:stop], self.indices[:, groups],
                           None if self.bias is None else self.bias[start:stop])
        if torch.is_grad_enabled() and x.requires_grad:
            return self(x)  # the layer's own inference-only error
        values, indices, bias = views[slot]
        n, m, vec, k, _ = self.meta
        return torch.ops.nmgen.nm_linear(x, values, indices, bias, n, m, vec, k,
                                         self.activation)

    def _apply(self, fn: Any, recurse: bool = True) -> FusedLinear:
        self._cache, self._views = None, (None, {})
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_cache"], state["_views"] = None, (None, {})
        return state


class FusedSlice(nn.Module):
    """A sibling layer of a fused group: its columns of the group's ``FusedLinear``
    product (a view: ``y[..., start:stop]``). Holds no tensors; its ``state_dict`` is
    that of the ``SparseLinear`` it replaced (its columns of the fused buffers, copied),
    and loading one writes them back."""

    def __init__(self, holder: FusedLinear, slot: int, name: str = ""):
        super().__init__()
        object.__setattr__(self, "holder", holder)  # not a submodule: the parent holds it
        self.slot, self.name = slot, name
        self.start, self.stop = holder.bounds[slot]
        self.in_features, self.out_features = holder.in_features, self.stop - self.start
        self.pattern, self.vec = holder.pattern, holder.vec

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.holder.output(x, self.slot)

    @property
    def activation(self) -> str:
        return self.holder.activation

    @property
    def meta(self) -> tuple[int, int, int, int, int]:
        return (self.pattern.n, self.pattern.m, self.vec, self.in_features,
                self.out_features)

    @property
    def dtype(self) -> torch.dtype:
        return self.holder.values.dtype

    @property
    def has_bias(self) -> bool:
        return self.holder.bias is not None

    def tensors(self) -> dict[str, torch.Tensor]:
        """This layer's ``values``, ``indices`` and ``bias`` (views of the fused ones)."""
        groups = slice(self.start // self.vec, -(-self.stop // self.vec))
        out = {"values": self.holder.values[:, self.start:self.stop],
               "indices": self.holder.indices[:, groups]}
        if self.holder.bias is not None:
            out["bias"] = self.holder.bias[self.start:self.stop]
        return out

    def dense_weight(self) -> torch.Tensor:
        """The pruned weight (``out×in``), dense, as ``SparseLinear.dense_weight``."""
        return self.holder.dense_weight()[self.start:self.stop].contiguous()

    def to_linear(self) -> nn.Linear:
        """An ``nn.Linear`` holding this layer's pruned weight densely (a reference)."""
        t = self.tensors()
        linear = nn.Linear(self.in_features, self.out_features, bias="bias" in t,
                           dtype=self.dtype, device=self.holder.values.device)
        with torch.no_grad():
            linear.weight.copy_(self.dense_weight())
            if "bias" in t:
                linear.bias.copy_(t["bias"])
        return linear.requires_grad_(False)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"columns {self.start}:{self.stop} of the fused product")

    # ---------------------------------------------------------------- the state
    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        for key, tensor in self.tensors().items():
            tensor = tensor if keep_vars else tensor.detach()
            destination[prefix + key] = tensor.contiguous()
        destination[prefix + "nm_meta"] = torch.tensor(self.meta, dtype=torch.int64,
                                                       device=self.holder.values.device)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              local_metadata: dict, strict: bool, missing_keys: list[str],
                              unexpected_keys: list[str], error_msgs: list[str]) -> None:
        """As ``SparseLinear``'s: a state of another pattern, L or shape, or values and
        indices that are not a valid N:M matrix, is refused; the columns are copied into
        the fused buffers."""
        title = prefix.rstrip(".") or "the layer"
        views = self.tensors()
        wanted = [*views, "nm_meta"]
        for key in wanted:
            if prefix + key not in state_dict:
                missing_keys.append(prefix + key)
        if strict:
            unexpected_keys += [key for key in state_dict if key.startswith(prefix)
                                and key[len(prefix):] not in wanted]
        meta = state_dict.get(prefix + "nm_meta")
        if meta is not None and tuple(int(v) for v in meta.tolist()) != self.meta:
            error_msgs.append(f"{title}: the state holds (n, m, L, in, out) = "
                              f"{tuple(meta.tolist())}, the layer is {self.meta} (a fused "
                              "sibling: nmgen.nn.load_sparse into the unfused model, then "
                              "fuse_siblings)")
            return
        given = {key: state_dict[prefix + key] for key in views if prefix + key in state_dict}
        reason = unreadable(given.get("values"), given.get("indices"), given.get("bias"))
        if reason is not None:
            error_msgs.append(f"{title}: {reason}")
            return
        if "values" in given and "indices" in given:
            try:
                NMMatrix.from_compressed(given["values"], given["indices"], self.pattern,
                                         self.vec, (self.in_features, self.out_features),
                                         layout="kn")
            except (ValueError, TypeError) as exc:
                error_msgs.append(f"{title}: {exc}")
                return
        for key, tensor in given.items():
            if tuple(tensor.shape) != tuple(views[key].shape):
                error_msgs.append(f"{title}: {key} is {tuple(tensor.shape)}, the layer's "
                                  f"is {tuple(views[key].shape)}")
                continue
            with torch.no_grad():
                views[key].copy_(tensor)
        if given:
            # the fused matrix is built again from the buffers (the holder's own load,
            # after its siblings', or the op's version check at the next call)
            self.holder._matrix = None
            self.holder.drop()


# ------------------------------------------------------------------------ fusing
def _why_not(parent: nn.Module, names: Sequence[str], layers: list[nn.Module | None],
             counts: dict[int, int]) -> str | None:
    missing = [n for n, layer in zip(names, layers, strict=True) if layer is None]
    if missing:
        return f"no {', '.join(missing)} in {type(parent).__name__}"
    for name, layer in zip(names, layers, strict=True):
        if isinstance(layer, FusedSlice):
            return f"{name} is fused already"
        if type(layer) is not SparseLinear:
            return f"{name} is a {type(layer).__name__}, not a SparseLinear"
        if layer._forward_hooks or layer._forward_pre_hooks:
            return f"{name} has forward hooks (a fused layer would not call them)"
        if counts.get(id(layer), 0) > 1:
            return f"{name} is shared with another module"
    first = layers[0]
    for attr, what in (("in_features", "in_features"), ("pattern", "pattern"),
                       ("vec", "L"), ("activation", "activation")):
        seen = [getattr(layer, attr) for layer in layers]
        if len(set(map(str, seen))) > 1:
            return f"{what} differs: {', '.join(map(str, seen))}"
    for what, of in (("dtype", lambda t: t.values.dtype), ("device", lambda t: t.values.device),
                     ("bias", lambda t: t.bias is not None)):
        seen = [of(layer) for layer in layers]
        if len(set(seen)) > 1:
            return f"{what} differs: {', '.join(map(str, seen))}"
    ragged = [n for n, layer in zip(names[:-1], layers[:-1], strict=True)
              if layer.out_features % first.vec]
    if ragged:
        return (f"out_features of {', '.join(ragged)} not a multiple of L = {first.vec} "
                "(their index groups would not line up; only the last may be ragged)")
    return None


def check_groups(groups: Groups) -> list[tuple[str, ...]]:
    """``groups`` as tuples of names, refused unless each is two or more distinct child
    names (a string is not a group: ``"qkv"`` would be read as the names q, k and v)."""
    if isinstance(groups, str) or not isinstance(groups, Iterable):
        raise TypeError(f"groups {groups!r}: expected groups of child names, e.g. "
                        "[('q_proj', 'k_proj', 'v_proj')] (nmgen.nn.LLAMA_SIBLINGS)")
    checked = []
    for group in groups:
        if isinstance(group, str) or not isinstance(group, Iterable):
            raise TypeError(f"group {group!r}: expected a tuple of child names, e.g. "
                            "('gate_proj', 'up_proj'), not a string")
        names = tuple(group)
        if not all(isinstance(n, str) for n in names):
            raise TypeError(f"group {names}: child names are strings")
        if len(names) < 2 or len(set(names)) != len(names):
            raise ValueError(f"group {names}: two or more distinct child names")
        checked.append(names)
    return checked


def fuse_siblings(model: nn.Module, groups: Groups = LLAMA_SIBLINGS, *,
                  compiled_inputs_unchanged: bool = False) -> FuseSummary:
    """Fuse every group of ``SparseLinear`` siblings of ``model`` in place (see the module
    docstring). ``groups``: tuples of child names (default: Llama's q/k/v and gate/up).
    A parent holding some of a group's names but not a fusable set of them is listed in
    ``skipped`` with the reason; one holding none of them is not mentioned.
    ``compiled_inputs_unchanged``: the caller's promise that no parent changes a group's
    input in place between its siblings' calls, which lets the siblings share one product
    under ``torch.compile`` where dynamo cannot check it (torch before 2.13)."""
    groups = check_groups(groups)
    counts: dict[int, int] = {}
    for _, module in model.named_modules(remove_duplicate=False):
        counts[id(module)] = counts.get(id(module), 0) + 1
    summary = FuseSummary([], [])
    for names in groups:
        for parent_name, parent in list(model.named_modules()):
            layers = [parent._modules.get(n) for n in names]
            if all(layer is None for layer in layers):
                continue
            reason = _why_not(parent, names, layers, counts)
            holder_name = "fused_" + "_".join(names)
            if reason is None and holder_name in parent.__dict__ | parent._modules:
                reason = f"{type(parent).__name__} has an attribute {holder_name} already"
            if reason is not None:
                summary.skipped.append(SkippedGroup(parent_name, names, reason))
                continue
            prefix = parent_name + "." if parent_name else ""
            _fuse(parent, names, layers, holder_name, prefix + holder_name, prefix,
                  compiled_inputs_unchanged)
            summary.fused.append(FusedGroup(parent_name, names, prefix + holder_name,
                                            tuple(layer.out_features for layer in layers)))
    return summary


def _fuse(parent: nn.Module, names: tuple[str, ...], layers: list[SparseLinear],
          holder_name: str, title: str, prefix: str, compiled_inputs_unchanged: bool) -> None:
    first = layers[0]
    bounds, start = [], 0
    for layer in layers:
        bounds.append((start, start + layer.out_features))
        start += layer.out_features
    holder = FusedLinear(first.in_features, start, first.pattern, first.vec,
                         bias=first.bias is not None, dtype=first.values.dtype,
                         device=first.values.device, name=title,
                         activation=first.activation, bounds=bounds,
                         compiled_inputs_unchanged=compiled_inputs_unchanged)
    with torch.no_grad():
        holder.values = torch.cat([layer.values for layer in layers], dim=1)
        holder.indices = torch.cat([layer.indices for layer in layers], dim=1)
        if first.bias is not None:
            holder.bias = torch.cat([layer.bias for layer in layers])
    holder._matrix = None
    holder._remember()  # CUDA: the fused matrix, built from the buffers (validated)
    parent.add_module(holder_name, holder)
    for slot, name in enumerate(names):
        setattr(parent, name, FusedSlice(holder, slot, prefix + name))
    parent.register_forward_hook(holder.drop, always_call=True)
