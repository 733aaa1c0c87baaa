"""Saving and loading sparsified models: the whole state through safetensors (lazily
imported), and loading it into a fresh model whose pruned layers are built from the state
(``<layer>.nm_meta`` holds each one's ``[n, m, L, in, out]``), without the dense weights."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
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
    folder = Path(path).parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{path}: its directory {folder} does not exist")
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
        missing, unexpected = model.load_state_dict(source, strict=strict)
    else:
        missing, unexpected = _safetensors().load_model(model, os.fspath(source),
                                                         strict=strict)
    if missing or unexpected:  # strict=False: said, not dropped without a word
        warnings.warn(f"load_sparse(strict=False): {_keys(missing)} of the model missing "
                      f"from the state (left as they were), {_keys(unexpected)} of the state "
                      "unused", stacklevel=2)
    if siblings is not None:
        fuse_siblings(model, siblings, compiled_inputs_unchanged=compiled_inputs_unchanged)
    return list(layers)


def _keys(keys: list[str]) -> str:
    shown = ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
    return f"{len(keys)} keys ({shown})" if keys else "no keys"


def _sparse_layers(source: Source) -> dict[str, tuple[tuple[int, ...], torch.dtype, bool]]:
    """Layer name -> (meta, dtype of the values, whether it has a bias) of every layer
    that ``source`` holds compressed."""
    if isinstance(source, Mapping):
        return _layers_of(list(source), source.__getitem__, lambda key: source[key].dtype)
    path = Path(source)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: a directory, not a safetensors file")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        opened = _safetensors().safe_open(os.fspath(source), framework="pt")
    except Exception as exc:  # safetensors' own error type, whatever its version
        raise ValueError(f"{path}: not a safetensors file ({exc})") from None
    with opened as handle:
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
        meta = _meta(key, tensor(key))
        dtype = dtype_of(prefix + "values") if prefix + "values" in names else None
        if len(meta) != 5 or dtype not in TORCH_DTYPES.values():
            raise ValueError(f"{key}: not an nmgen sparse layer's state (meta {meta}, "
                             f"values {dtype})")
        layers[prefix.rstrip(".")] = (meta, dtype, prefix + "bias" in names)
    orphans = [k for k in keys if (k == "indices" or k.endswith(".indices"))
               and k[: -len("indices")] + "values" in names
               and k[: -len("indices")].rstrip(".") not in layers]
    if orphans:  # a dense model would take them as unexpected keys, dropped by strict=False
        raise ValueError(f"{orphans[0]}: compressed indices without their layer's {META}: "
                         "not a state nmgen.nn.save_sparse wrote")
    return layers


def _meta(key: str, value: torch.Tensor) -> tuple[int, ...]:
    """A layer's ``[n, m, L, in, out]``: integers (a float would be truncated unseen)."""
    if value.dtype.is_floating_point or value.dtype.is_complex or value.ndim != 1:
        raise ValueError(f"{key}: expected 5 integers [n, m, L, in, out], got a "
                         f"{tuple(value.shape)} {value.dtype} tensor")
    return tuple(int(v) for v in value.tolist())


def _make_sparse(model: nn.Module, name: str, meta: tuple[int, ...], dtype: torch.dtype,
                 bias: bool, device: Any) -> None:
    """Put an empty ``SparseLinear`` of ``meta`` at ``name`` (unless one of it is there).
    A layer of ``model`` sparsified otherwise (pattern, L, dtype or bias) is refused: its
    pattern would be replaced by the state's without a word."""
    try:
        module = model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"{name}: the state holds a sparse layer there; the model has no "
                         "such module") from None
    if isinstance(module, SparseLinear):
        here = (module.meta, module.values.dtype, module.bias is not None)
        if here == (meta, dtype, bias):
            return
        raise ValueError(f"{name}: the model's layer is sparsified as (n, m, L, in, out) = "
                         f"{here[0]}, {here[1]}, bias {here[2]}; the state holds "
                         f"{tuple(meta)}, {dtype}, bias {bias}: load into the dense model "
                         "(load_sparse builds its layers from the state)")
    if isinstance(module, FusedSlice):
        if module.meta == meta and module.dtype == dtype and module.has_bias == bias:
            return
        raise ValueError(f"{name}: a fused sibling ({module.meta}, {module.dtype}, bias "
                         f"{module.has_bias}); the state holds {tuple(meta)}, {dtype}, bias "
                         f"{bias}: load into the unfused model, then fuse_siblings")
    n, m, vec, k, out = meta
    if isinstance(module, nn.Linear):
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
