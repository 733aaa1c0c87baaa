"""Saving and loading sparsified models: the whole state through safetensors (lazily
imported), and loading it into a fresh model whose pruned layers are built from the state
(``<layer>.nm_meta`` holds each one's ``[n, m, L, in, out]``), without the dense weights."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from .fuse import FusedSlice, Groups, fuse_siblings
from .linear import TORCH_DTYPES, SparseLinear
from .sparsify import fuse_activations

META = "nm_meta"
_FILE_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}

Source = str | os.PathLike | Mapping[str, torch.Tensor]


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError as exc:
        raise ImportError("saving and loading files needs safetensors: pip install "
                          "safetensors (or pip install -e '.[torch]')") from exc
    return safetensors.torch


def save_sparse(model: nn.Module, path: str | os.PathLike,
                metadata: dict[str, str] | None = None) -> None:
    """Write ``model``'s state (its ``SparseLinear`` layers compressed) to a safetensors
    file; tied tensors are written once (``safetensors.torch.save_model``)."""
    _safetensors().save_model(model, os.fspath(path), metadata=metadata)


def load_sparse(model: nn.Module, source: Source, *, strict: bool = True,
                device: Any = None, fuse: bool = True,
                siblings: Groups | None = None,
                compiled_inputs_unchanged: bool = False) -> list[str]:
    """Load a sparsified model's state (a safetensors file, or a ``state_dict``) into
    ``model``: every layer the state holds compressed is first made a ``SparseLinear`` of
    its pattern, L, shape, dtype and bias (in place of the model's ``nn.Linear``, on its
    device, or on ``device`` where given), then the state is loaded (``strict`` as in
    ``load_state_dict``). With ``fuse``, activations that directly follow those layers in
    an ``nn.Sequential`` are fused into them as ``sparsify`` does (the state holds no
    activation). With ``siblings``, sibling groups are then fused (``fuse_siblings``, with
    ``compiled_inputs_unchanged``; the state is the same fused or not). Layers of
    ``model`` fused already (``FusedSlice``) of the state's shape load in place. Returns
    the names of the sparse layers."""
    layers = _sparse_layers(source)
    for name, (meta, dtype, bias) in layers.items():
        _make_sparse(model, name, meta, dtype, bias, device)
    if fuse:
        fuse_activations(model, set(layers))
    if isinstance(source, Mapping):
        model.load_state_dict(source, strict=strict)
    else:
        _safetensors().load_model(model, os.fspath(source), strict=strict)
    if siblings is not None:
        fuse_siblings(model, siblings, compiled_inputs_unchanged=compiled_inputs_unchanged)
    return list(layers)


def _sparse_layers(source: Source) -> dict[str, tuple[tuple[int, ...], torch.dtype, bool]]:
    """Layer name -> (meta, dtype of the values, whether it has a bias) of every layer
    that ``source`` holds compressed."""
    if isinstance(source, Mapping):
        return _layers_of(list(source), source.__getitem__, lambda key: source[key].dtype)
    with _safetensors().safe_open(os.fspath(source), framework="pt") as handle:
        return _layers_of(list(handle.keys()), handle.get_tensor,
                          lambda key: _FILE_DTYPES.get(handle.get_slice(key).get_dtype()))


def _layers_of(keys: list[str], tensor: Any, dtype_of: Any
               ) -> dict[str, tuple[tuple[int, ...], torch.dtype, bool]]:
    layers = {}
    names = set(keys)
    for key in keys:
        if key != META and not key.endswith("." + META):
            continue
        prefix = key[: -len(META)]
        meta = tuple(int(v) for v in tensor(key).tolist())
        dtype = dtype_of(prefix + "values") if prefix + "values" in names else None
        if len(meta) != 5 or dtype not in TORCH_DTYPES.values():
            raise ValueError(f"{key}: not an nmgen sparse layer's state (meta {meta}, "
                             f"values {dtype})")
        layers[prefix.rstrip(".")] = (meta, dtype, prefix + "bias" in names)
    return layers


def _make_sparse(model: nn.Module, name: str, meta: tuple[int, ...], dtype: torch.dtype,
                 bias: bool, device: Any) -> None:
    """Put an empty ``SparseLinear`` of ``meta`` at ``name`` (unless one of it is there)."""
    module = model.get_submodule(name)
    if isinstance(module, SparseLinear) and module.meta == meta \
            and module.values.dtype == dtype and (module.bias is not None) == bias:
        return
    if isinstance(module, FusedSlice):
        if module.meta == meta and module.dtype == dtype and module.has_bias == bias:
            return
        raise ValueError(f"{name}: a fused sibling ({module.meta}, {module.dtype}, bias "
                         f"{module.has_bias}); the state holds {tuple(meta)}, {dtype}, bias "
                         f"{bias}: load into the unfused model, then fuse_siblings")
    n, m, vec, k, out = meta
    if isinstance(module, SparseLinear):
        here = module.values.device
    elif isinstance(module, nn.Linear):
        if (module.in_features, module.out_features) != (k, out):
            raise ValueError(f"{name}: the state holds a {k}→{out} layer; the model's is "
                             f"{module.in_features}→{module.out_features}")
        here = module.weight.device
    else:
        raise ValueError(f"{name or 'the model'}: the state holds a sparse linear layer; "
                         f"the model has a {type(module).__name__} there")
    if not name:
        raise ValueError("the model itself is the sparse layer: build it with SparseLinear "
                         "and call load_state_dict")
    target = device if device is not None else ("cpu" if here.type == "meta" else here)
    layer = SparseLinear(k, out, (n, m), vec, bias=bias, dtype=dtype, device=target,
                         name=name)
    parent_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent_name), attr, layer)
