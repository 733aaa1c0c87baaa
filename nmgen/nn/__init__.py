"""PyTorch integration: N:M sparse ``Linear`` layers that run through ``nmgen.dispatch``.

- ``SparseLinear.from_dense(linear, "8:32", vec=128)``: one layer, pruned and compressed.
- ``sparsify(model, "8:32", 128, include=..., exclude=...)``: every matching ``nn.Linear``
  of a model replaced in place, an activation that directly follows one in an
  ``nn.Sequential`` fused into its kernels' epilogue; returns a ``SparsifySummary``.
- ``torch.ops.nmgen.nm_linear``: the custom op the layers call (``torch.compile`` with
  ``fullgraph=True`` and CUDA graphs take it); CUDA tensors run nmgen's kernels, CPU
  tensors a float32 reference.
- ``fuse_siblings(model, LLAMA_SIBLINGS)``: sibling layers that read the same input (q/k/v,
  gate/up) computed as one product over their concatenated outputs (one op per group,
  eager and under ``torch.compile``).
- ``save_sparse`` / ``load_sparse``: a pruned model's state through safetensors, loaded
  into a fresh model without its dense weights; ``state_dict`` round-trips as usual.

Inference only: a layer refuses to run where a gradient is asked of it.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "nmgen.nn needs PyTorch: pip install torch (or pip install -e '.[torch]'); "
        "the rest of nmgen (import nmgen, nmgen.prune, nmgen.dispatch on CuPy arrays) "
        "works without it") from exc

from .fuse import (
    LLAMA_SIBLINGS,
    FusedGroup,
    FusedLinear,
    FusedSlice,
    FuseSummary,
    SkippedGroup,
    fuse_siblings,
)
from .io import load_sparse, save_sparse
from .linear import SparseLinear
from .ops import nm_linear, to_dense
from .sparsify import (
    FusedActivation,
    LayerChange,
    SkippedLayer,
    SparsifySummary,
    fuse_activations,
    servable,
    sparsify,
)

__all__ = [
    "LLAMA_SIBLINGS",
    "FuseSummary",
    "FusedActivation",
    "FusedGroup",
    "FusedLinear",
    "FusedSlice",
    "LayerChange",
    "SkippedGroup",
    "SkippedLayer",
    "SparseLinear",
    "SparsifySummary",
    "fuse_activations",
    "fuse_siblings",
    "load_sparse",
    "nm_linear",
    "save_sparse",
    "servable",
    "sparsify",
    "to_dense",
]
