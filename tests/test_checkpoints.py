"""Published 2:4 checkpoints on the CPU: weights that already hold element-wise 2:4 (their
zeros in place, -0.0 among them) are kept exactly by ``nmgen.nn.sparsify(model, "2:4",
vec=1)``, which counts them apart from the layers it prunes; a transformers Llama saved
with 2:4 zeros (``save_pretrained``), loaded back and sparsified, holds bit-identical
weights."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import nmgen.nn  # noqa: E402


def prune_in_place(weight: torch.Tensor, generator: torch.Generator) -> None:
    """Zero the two smallest of every group of four along in-features, some with -0.0."""
    rows, cols = weight.shape
    groups = weight.data.view(rows, cols // 4, 4)
    smallest = groups.abs().float().topk(2, dim=2, largest=False).indices
    zeros = torch.where(torch.rand(smallest.shape, generator=generator) < 0.5, -0.0, 0.0)
    groups.scatter_(2, smallest, zeros.to(weight.dtype))


def dense_of(layer: nmgen.nn.SparseLinear) -> torch.Tensor:
    """The [out, in] weight a SparseLinear multiplies by."""
    return torch.from_numpy(layer.matrix.to_dense().T.astype(np.float32)).to(layer.values.dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, -0.0 taken as 0.0 (a pruned position reads back as +0.0)."""
    a, b = (t.detach().clone() for t in (a, b))
    a[a == 0], b[b == 0] = 0.0, 0.0
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_sparsify_keeps_2of4_weights_exactly_and_counts_them_apart():
    generator = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 48), nn.Linear(48, 16)).bfloat16()
    for layer in (model[0], model[2]):
        prune_in_place(layer.weight, generator)
    before = [layer.weight.detach().clone() for layer in model]
    summary = nmgen.nn.sparsify(model, "2:4", vec=1)
    assert (summary.already_sparse, summary.pruned) == (2, 1)
    assert "2 already held 2:4 (kept exactly), 1 pruned" in str(summary)
    assert same_bits(dense_of(model[0]), before[0]) and same_bits(dense_of(model[2]), before[2])
    assert not same_bits(dense_of(model[1]), before[1])  # a dense weight was pruned


def test_a_saved_2of4_llama_loads_back_and_sparsifies_bit_identical(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=128)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    generator = torch.Generator().manual_seed(1)
    projections = [name for name, module in model.named_modules()
                   if isinstance(module, nn.Linear) and name.startswith("model.layers.")]
    for name in projections:
        prune_in_place(model.get_submodule(name).weight, generator)
    model.save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    saved = {name: loaded.get_submodule(name).weight.detach().clone() for name in projections}
    for name in projections:  # the file holds the zeros in place
        assert same_bits(saved[name], model.get_submodule(name).weight)
    summary = nmgen.nn.sparsify(loaded, "2:4", vec=1,
                                include=["*.self_attn.*_proj", "*.mlp.*_proj"])
    assert len(summary.replaced) == len(projections) == 14
    assert summary.already_sparse == 14 and summary.pruned == 0
    for name in projections:
        assert same_bits(dense_of(loaded.get_submodule(name)), saved[name]), name
