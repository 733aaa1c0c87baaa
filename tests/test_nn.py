"""nmgen.nn on CPU: SparseLinear and sparsify against the dense pruned model, the custom op
under torch.compile, saving and loading, the inference-only errors, the summary, and the
layers sparsify leaves alone. The CPU path is the op's float32 reference."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import nmgen  # noqa: E402
import nmgen.nn as nmnn  # noqa: E402

PATTERN, VEC = "8:32", 16
# Relative Frobenius error of a model's output against the float64 product of the same
# pruned weights: float32 sums in another order; bfloat16 rounds every layer's output
# (2**-9 relative at most) and the activations between layers, three layers deep.
RTOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


class Block(nn.Module):
    """A small model: K and N off the multiples of m and L, a nested layer, no-bias and
    bias layers, an activation between them."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(70, 96)
        self.act = nn.GELU()
        self.inner = nn.Sequential(nn.Linear(96, 33, bias=False))
        self.down = nn.Linear(33, 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.inner(self.act(self.up(x))))


def make(dtype: torch.dtype = torch.float32, seed: int = 0) -> Block:
    torch.manual_seed(seed)
    return Block().to(dtype)


def pruned_reference(model: nn.Module, pattern: str = PATTERN, vec: int = VEC) -> nn.Module:
    """The model in float64 with each Linear's weight pruned by nmgen.prune, densely."""
    ref = copy.deepcopy(model).double()
    with torch.no_grad():
        for module in ref.modules():
            if isinstance(module, nn.Linear):
                b = nmgen.prune(module.weight.float(), pattern, vec, layout="nk")
                module.weight.copy_(torch.from_numpy(b.to_dense().T.astype(np.float64)))
    return ref


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_sparsified_model_matches_the_dense_pruned_model(dtype):
    model = make(dtype)
    ref = pruned_reference(model)
    summary = nmnn.sparsify(model, PATTERN, VEC)
    assert [c.name for c in summary.replaced] == ["up", "inner.0", "down"]
    assert all(isinstance(m, nmnn.SparseLinear) for m in (model.up, model.inner[0], model.down))
    x = torch.randn(2, 3, 70).to(dtype)
    with torch.no_grad():
        out = model(x)
        expected = ref(x.double())
    assert out.shape == (2, 3, 20) and out.dtype == dtype
    assert rel_err(out, expected) < RTOL[dtype]


def test_layer_keeps_what_nmgen_prune_keeps_and_the_bias():
    torch.manual_seed(1)
    linear = nn.Linear(70, 50)
    layer = nmnn.SparseLinear.from_dense(linear, PATTERN, VEC)
    b = nmgen.prune(linear.weight, PATTERN, VEC, layout="nk")
    assert torch.equal(layer.dense_weight(), torch.from_numpy(b.to_dense().T.copy()))
    assert torch.equal(layer.bias, linear.bias.detach())
    assert layer.values.dtype == torch.float32 and layer.indices.dtype == torch.uint8
    assert tuple(layer.nm_meta.tolist()) == (8, 32, 16, 70, 50)
    dense = layer.to_linear()
    x = torch.randn(4, 70)
    with torch.no_grad():
        assert rel_err(layer(x), dense(x)) < 1e-6


@pytest.mark.parametrize("shape", [(70,), (0, 70), (1, 1, 70), (2, 3, 4, 70)], ids=str)
def test_any_leading_shape(shape):
    layer = nmnn.SparseLinear.from_dense(make().up, PATTERN, VEC)
    x = torch.randn(shape)
    with torch.inference_mode():
        out = layer(x)
    assert out.shape == (*shape[:-1], 96)
    if x.numel():
        expected = x.double() @ layer.dense_weight().double().T + layer.bias.double()
        assert rel_err(out, expected) < 1e-5


def test_non_contiguous_input_is_read_right():
    layer = nmnn.SparseLinear.from_dense(make().up, PATTERN, VEC)
    x = torch.randn(70, 6).T  # K-major 6×70
    y = torch.randn(6, 140)[:, ::2]  # every other column
    with torch.no_grad():
        for a in (x, y):
            assert rel_err(layer(a), layer(a.contiguous())) == 0.0


def test_op_passes_torch_library_opcheck():
    layer = nmnn.SparseLinear.from_dense(make().up, PATTERN, VEC)
    for x, bias in ((torch.randn(3, 70), layer.bias), (torch.randn(2, 4, 70), None)):
        args = (x, layer.values, layer.indices, bias, 8, 32, VEC, 70)
        torch.library.opcheck(torch.ops.nmgen.nm_linear.default, args)


def test_op_refuses_operands_that_do_not_line_up():
    layer = nmnn.SparseLinear.from_dense(make().up, PATTERN, VEC)
    with torch.no_grad(), pytest.raises(ValueError, match="last dimension must be K = 70"):
        layer(torch.randn(3, 71))
    with torch.no_grad(), pytest.raises(TypeError, match="activations in the layer's dtype"):
        layer(torch.randn(3, 70, dtype=torch.float64))


def test_fullgraph_compile_on_cpu():
    """Inductor compiles the model in one graph (fullgraph raises at a graph break), with
    the op called opaquely, and gives the eager outputs."""
    model = make()
    nmnn.sparsify(model, PATTERN, VEC)
    compiled = torch.compile(model, fullgraph=True)
    with torch.inference_mode():
        for shape in ((5, 70), (2, 3, 70)):
            x = torch.randn(shape)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-6, atol=1e-6)


def test_state_dict_round_trip_into_a_fresh_dense_model():
    model = make(torch.bfloat16)
    nmnn.sparsify(model, PATTERN, VEC)
    state = model.state_dict()
    assert {"up.values", "up.indices", "up.nm_meta", "up.bias", "inner.0.values"} <= set(state)
    assert "up.weight" not in state and "inner.0.bias" not in state
    fresh = make(torch.bfloat16, seed=7)  # other dense weights, replaced by the state's
    assert sorted(nmnn.load_sparse(fresh, state)) == ["down", "inner.0", "up"]
    assert isinstance(fresh.inner[0], nmnn.SparseLinear) and fresh.inner[0].bias is None
    x = torch.randn(4, 70, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))
    again = make(torch.bfloat16, seed=9)
    nmnn.sparsify(again, PATTERN, VEC)
    again.load_state_dict(state)  # into a sparsified model: buffers copied in place
    with torch.no_grad():
        assert torch.equal(again(x), model(x))


def test_load_refuses_another_pattern_and_broken_indices():
    model = make()
    nmnn.sparsify(model, PATTERN, VEC)
    state = model.state_dict()
    other = make()
    nmnn.sparsify(other, "16:32", VEC)
    with pytest.raises(RuntimeError, match="the state holds"):
        other.load_state_dict(state)
    broken = dict(state)
    broken["up.indices"] = torch.full_like(state["up.indices"], 40)
    target = make()
    nmnn.sparsify(target, PATTERN, VEC)
    with pytest.raises(RuntimeError, match="out of range"):
        target.load_state_dict(broken)


def test_safetensors_round_trip(tmp_path):
    pytest.importorskip("safetensors")
    model = make(torch.bfloat16)
    nmnn.sparsify(model, PATTERN, VEC, exclude="down")
    path = tmp_path / "model.safetensors"
    nmnn.save_sparse(model, path)
    fresh = make(torch.bfloat16, seed=3)
    assert sorted(nmnn.load_sparse(fresh, path)) == ["inner.0", "up"]
    assert isinstance(fresh.down, nn.Linear)  # dense in the file, loaded as it was
    x = torch.randn(2, 70, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))


def test_gradient_asked_is_a_clear_error():
    model = make()
    nmnn.sparsify(model, PATTERN, VEC)
    x = torch.randn(2, 70, requires_grad=True)
    with pytest.raises(RuntimeError, match="SparseLinear 'up'.*inference-only"):
        model(x)
    with torch.no_grad():
        model(x)
    with torch.inference_mode():
        model(x)
    layer = model.up
    out = torch.ops.nmgen.nm_linear(x, layer.values, layer.indices, layer.bias, 8, 32, VEC, 70)
    with pytest.raises(RuntimeError, match="inference-only"):
        out.sum().backward()


def test_summary_numbers():
    model = make()
    summary = nmnn.sparsify(model, PATTERN, VEC, include="up")
    (change,) = summary.replaced
    windows = 24  # ceil(70 / 32) * 8 kept rows
    assert change.params_before == 70 * 96 + 96
    assert change.params_after == windows * 96 + 96
    assert change.bytes_before == 4 * (70 * 96 + 96)
    # values, indices (one byte per kept row and group of 16 outputs), bias, nm_meta
    assert change.bytes_after == 4 * windows * 96 + windows * 6 + 4 * 96 + 8 * 5
    assert summary.bytes_saved == change.bytes_before - change.bytes_after
    assert summary.params_before == change.params_before
    text = str(summary)
    assert "8:32 L=16: 1 of 1 selected Linear layers replaced, 0 skipped" in text
    assert "parameters 6,816 -> 2,400 (35.2%)" in text


def test_unservable_layers_are_skipped_and_reported():
    torch.manual_seed(0)
    tied = nn.Linear(16, 16)
    model = nn.ModuleDict({
        "f64": nn.Linear(64, 64).double(),
        "attn": nn.MultiheadAttention(32, 4),
        "nan": nn.Linear(64, 64),
        "a": tied, "b": nn.Sequential(tied),
        "ok": nn.Linear(64, 40),
    })
    with torch.no_grad():
        model["nan"].weight[0, 0] = float("nan")
    summary = nmnn.sparsify(model, PATTERN, VEC)
    assert [c.name for c in summary.replaced] == ["ok"]
    reasons = {s.name: s.reason for s in summary.skipped}
    assert set(reasons) == {"f64", "attn.out_proj", "nan", "a"}
    assert "float64" in reasons["f64"]
    assert "subclass of nn.Linear" in reasons["attn.out_proj"]
    assert "non-finite" in reasons["nan"]
    assert "shared" in reasons["a"]
    assert isinstance(model["f64"], nn.Linear) and isinstance(model["ok"], nmnn.SparseLinear)
    for name in reasons:
        assert f"skipped {name}: " in str(summary)


def test_include_and_exclude_select_by_glob_or_predicate():
    model = make()
    summary = nmnn.sparsify(model, PATTERN, VEC, include=["up", "inner.*"], exclude="inner.0")
    assert [c.name for c in summary.replaced] == ["up"]
    summary = nmnn.sparsify(model, PATTERN, VEC,
                            include=lambda name, module: module.out_features == 20)
    assert [c.name for c in summary.replaced] == ["down"] and not summary.skipped


def test_copies_and_dtype_moves_keep_working():
    model = make()
    nmnn.sparsify(model, PATTERN, VEC)
    x = torch.randn(3, 70)
    with torch.no_grad():
        expected = model(x)
        assert torch.equal(copy.deepcopy(model)(x), expected)
        half = copy.deepcopy(model).to(torch.bfloat16)
        assert half.up.values.dtype == torch.bfloat16 and half.up.matrix.dtype.value == "bf16"
        assert rel_err(half(x.to(torch.bfloat16)), expected) < RTOL[torch.bfloat16]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="vector length"):
        nmnn.sparsify(make(), PATTERN, 0)
    with pytest.raises(ValueError, match="expected 'n:m'"):
        nmnn.sparsify(make(), "8/32", VEC)
    with pytest.raises(TypeError, match="nmgen takes"):
        nmnn.SparseLinear(8, 8, PATTERN, VEC, dtype=torch.float64)


def test_import_nmgen_works_without_torch_and_nmgen_nn_says_why():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import nmgen\n"
            "try:\n    import nmgen.nn\nexcept ImportError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parent.parent).stdout
    assert "refused: nmgen.nn needs PyTorch" in out


def test_the_op_keeps_one_matrix_per_weight_while_it_lives():
    """CUDA calls look the weight's NMMatrix up by the tensors (device-agnostic logic,
    checked here on CPU tensors): remembered, rebuilt after an in-place change, dropped
    when the values tensor goes."""
    import gc

    from nmgen.nn import ops

    layer = nmnn.SparseLinear.from_dense(make().up, PATTERN, VEC)
    values, indices = layer.values.clone(), layer.indices.clone()
    args = (values, indices, 8, 32, VEC, 70)
    given = ops.remember(*args, matrix=layer.matrix)
    assert ops.matrix_of(*args) is given
    with torch.no_grad():
        values.mul_(2)  # a new version: built again from the tensors
    rebuilt = ops.matrix_of(*args)
    assert rebuilt is not given and ops.matrix_of(*args) is rebuilt
    np.testing.assert_array_equal(rebuilt.values.astype(np.float32),
                                  2 * given.values.astype(np.float32))
    key = ops._key(*args)
    assert key in ops._ENTRIES
    del values, args
    gc.collect()
    assert key not in ops._ENTRIES


# ------------------------------------------------------------------------ epilogue
ACTIVATIONS = {"relu": torch.relu, "gelu": torch.nn.functional.gelu,
               "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
               "silu": torch.nn.functional.silu, "none": lambda x: x}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["f32", "bf16", "f16"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_op_applies_bias_and_activation_as_float64_does(activation, bias, dtype):
    """The CPU reference: product, bias and activation in float32, rounded once."""
    torch.manual_seed(2)
    linear = nn.Linear(70, 45, bias=bias).to(dtype)
    layer = nmnn.SparseLinear.from_dense(linear, PATTERN, VEC, activation=activation)
    x = torch.randn(2, 3, 70).to(dtype)
    with torch.no_grad():
        out = layer(x)
    expected = x.double() @ layer.dense_weight().double().T
    if bias:
        expected += layer.bias.double()
    expected = ACTIVATIONS[activation](expected)
    assert out.dtype == dtype and out.shape == (2, 3, 45)
    tol = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    assert rel_err(out, expected) < tol


def test_op_with_an_activation_passes_opcheck_and_refuses_an_unknown_one():
    layer = nmnn.SparseLinear.from_dense(make().up, PATTERN, VEC)
    for activation in ("gelu_tanh", "silu"):
        args = (torch.randn(3, 70), layer.values, layer.indices, layer.bias, 8, 32, VEC, 70,
                activation)
        torch.library.opcheck(torch.ops.nmgen.nm_linear.default, args)
    with pytest.raises(ValueError, match="activation 'tanh': expected one of"):
        torch.ops.nmgen.nm_linear(torch.randn(3, 70), layer.values, layer.indices,
                                  layer.bias, 8, 32, VEC, 70, "tanh")
    with pytest.raises(ValueError, match="activation 'tanh'"):
        nmnn.SparseLinear(8, 8, PATTERN, VEC, activation="tanh")


class Mlp(nn.Module):
    """Linear layers directly followed by activations in nn.Sequential containers (one
    nested), and one whose activation is a call in forward (nothing to fuse)."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(70, 96), nn.GELU(), nn.Linear(96, 40), nn.SiLU(),
                                 nn.Sequential(nn.Linear(40, 33), nn.ReLU(inplace=True)),
                                 nn.Linear(33, 24), nn.GELU(approximate="tanh"),
                                 nn.Dropout(0.0), nn.Linear(24, 20))
        self.out = nn.Linear(20, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.out(self.seq(x)))


def test_sparsify_fuses_an_activation_that_follows_a_layer_in_a_sequential():
    torch.manual_seed(3)
    model = Mlp()
    ref = pruned_reference(model)
    summary = nmnn.sparsify(model, PATTERN, VEC)
    assert [(f.layer, f.module, f.activation) for f in summary.fused] == [
        ("seq.0", "seq.1", "gelu"), ("seq.2", "seq.3", "silu"), ("seq.5", "seq.6", "gelu_tanh"),
        ("seq.4.0", "seq.4.1", "relu")]
    assert "fused seq.1 (gelu) into seq.0's epilogue" in str(summary)
    seq = model.seq
    assert [type(m).__name__ for m in seq] == [
        "SparseLinear", "Identity", "SparseLinear", "Identity", "Sequential", "SparseLinear",
        "Identity", "Dropout", "SparseLinear"]
    assert (seq[0].activation, seq[8].activation, model.out.activation) == (
        "gelu", "none", "none")
    assert "activation=silu" in repr(seq[2])
    x = torch.randn(5, 70)
    with torch.no_grad():
        assert rel_err(model(x), ref(x.double())) < 1e-5
    assert set(model.state_dict()) == {k for k in ref.state_dict() if not k.endswith("weight")
                                       } | {k.replace("weight", n) for k in ref.state_dict()
                                            if k.endswith("weight")
                                            for n in ("values", "indices", "nm_meta")}


def test_no_fusion_where_asked_not_to_or_where_a_hook_would_see_it():
    model = Mlp()
    assert nmnn.sparsify(model, PATTERN, VEC, fuse=False).fused == []
    assert isinstance(model.seq[1], nn.GELU)
    hooked = Mlp()
    hooked.seq[1].register_forward_hook(lambda module, inputs, output: None)
    summary = nmnn.sparsify(hooked, PATTERN, VEC, exclude="seq.2")
    assert [f.layer for f in summary.fused] == ["seq.5", "seq.4.0"]  # seq.1 hooked, seq.2 kept
    assert isinstance(hooked.seq[1], nn.GELU) and isinstance(hooked.seq[3], nn.SiLU)


def test_fused_model_compiles_whole_and_loads_into_a_fresh_dense_one():
    torch.manual_seed(4)
    model = Mlp().to(torch.bfloat16)
    nmnn.sparsify(model, PATTERN, VEC)
    x = torch.randn(3, 70, dtype=torch.bfloat16)
    with torch.inference_mode():
        eager = model(x)
        torch.testing.assert_close(torch.compile(model, fullgraph=True)(x), eager)
    fresh = Mlp().to(torch.bfloat16)
    nmnn.load_sparse(fresh, model.state_dict())
    assert fresh.seq[0].activation == "gelu" and isinstance(fresh.seq[1], nn.Identity)
    with torch.no_grad():
        assert torch.equal(fresh(x), eager)
    unfused = Mlp().to(torch.bfloat16)
    nmnn.load_sparse(unfused, model.state_dict(), fuse=False)
    assert isinstance(unfused.seq[1], nn.GELU)
    with torch.no_grad():
        assert rel_err(unfused(x), eager) < RTOL[torch.bfloat16]


# ------------------------------------------------------------------------ sibling fusion
class Attention(nn.Module):
    """Llama's projections: q, k (narrower: grouped heads), v and o, no bias."""

    def __init__(self, hidden: int = 64, kv: int = 32) -> None:
        super().__init__()
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, kv, bias=False)
        self.v_proj = nn.Linear(hidden, kv, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, 4, 16).transpose(1, 2)
        k = self.k_proj(x).view(b, t, 2, 16).transpose(1, 2).repeat_interleave(2, 1)
        v = self.v_proj(x).view(b, t, 2, 16).transpose(1, 2).repeat_interleave(2, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / 4, dim=-1) @ v
        return self.o_proj(att.transpose(1, 2).reshape(b, t, -1))


class LlamaMlp(nn.Module):
    def __init__(self, hidden: int = 64, inter: int = 96, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Decoder(nn.Module):
    """Two Llama-like layers in plain torch."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.layers = nn.ModuleList(
            nn.ModuleDict({"self_attn": Attention(), "mlp": LlamaMlp()}) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer["self_attn"](self.norm(x))
            x = x + layer["mlp"](self.norm(x))
        return x


def decoders(dtype: torch.dtype = torch.float32, seed: int = 5) -> tuple[nn.Module, nn.Module]:
    """The same sparsified decoder, unfused and fused."""
    torch.manual_seed(seed)
    plain = Decoder().to(dtype)
    nmnn.sparsify(plain, PATTERN, VEC)
    fused = copy.deepcopy(plain)
    summary = nmnn.fuse_siblings(fused)
    assert [g.holder for g in summary.fused] == [
        f"layers.{i}.{name}" for i in (0, 1) for name in (
            "self_attn.fused_q_proj_k_proj_v_proj",)] + [
        f"layers.{i}.mlp.fused_gate_proj_up_proj" for i in (0, 1)]
    assert not summary.skipped
    return plain, fused


def nm_linear_calls(counts: list[int]):
    """A torch.compile backend that records how many nmgen::nm_linear calls each graph
    holds, then runs the graph as traced."""
    targets = (torch.ops.nmgen.nm_linear, torch.ops.nmgen.nm_linear.default)

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        counts.append(sum(1 for node in gm.graph.nodes
                          if node.op == "call_function" and node.target in targets))
        return gm.forward

    return backend


def test_fused_siblings_run_apart_under_compile_where_dynamo_cannot_compare_data_ptrs(
        monkeypatch):
    """torch 2.11's dynamo raises at a data_ptr comparison: there each slice computes its
    own columns in the compiled graph (the unfused op count), with the unfused outputs."""
    import nmgen.nn.fuse as fuse

    monkeypatch.setattr(fuse, "_same_traced", None)
    plain, fused = decoders()
    x = torch.randn(2, 5, 64)
    counts: list[int] = []
    with torch.no_grad():
        torch._dynamo.reset()
        out = torch.compile(fused, backend=nm_linear_calls(counts), fullgraph=True)(x)
        assert torch.equal(out, plain(x))
        assert torch.equal(fused(x), plain(x))  # eager still shares
    assert counts == [14]
    torch._dynamo.reset()


def test_fused_siblings_share_by_identity_under_compile_where_the_caller_promises_it(
        monkeypatch):
    """Where dynamo cannot compare data_ptrs, ``compiled_inputs_unchanged`` lets each
    group's slices share one product in the compiled graph (the fused op count), with the
    unfused outputs; eager sharing keeps its version check."""
    import nmgen.nn.fuse as fuse

    monkeypatch.setattr(fuse, "_same_traced", None)
    torch.manual_seed(5)
    plain = Decoder()
    nmnn.sparsify(plain, PATTERN, VEC)
    fused = copy.deepcopy(plain)
    summary = nmnn.fuse_siblings(fused, compiled_inputs_unchanged=True)
    assert len(summary.fused) == 4 and not summary.skipped
    x = torch.randn(2, 5, 64)
    counts: list[int] = []
    with torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(fused, backend=nm_linear_calls(counts), fullgraph=True)
        assert torch.equal(compiled(x), plain(x))
        y = torch.randn(2, 5, 64)  # the graph again, on other data
        assert torch.equal(compiled(y), plain(y))
        mlp = fused.layers[0]["mlp"]
        mlp.gate_proj(x)
        x.add_(1)  # eager: the version check still sees an in-place change
        assert torch.equal(mlp.up_proj(x), plain.layers[0]["mlp"].up_proj(x))
    assert counts == [8]
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_fused_siblings_give_the_unfused_outputs_eager_and_compiled(dtype):
    plain, fused = decoders(dtype)
    attn = fused.layers[0]["self_attn"]
    assert isinstance(attn.q_proj, nmnn.FusedSlice) and attn.k_proj.out_features == 32
    assert isinstance(attn.fused_q_proj_k_proj_v_proj, nmnn.FusedLinear)
    assert isinstance(attn.o_proj, nmnn.SparseLinear)  # reads another input
    x = torch.randn(2, 5, 64).to(dtype)
    for grad_mode in (torch.no_grad, torch.inference_mode):
        with grad_mode():
            expected = plain(x)
            # CPU: every output column is the same float32 sum over K, fused or not
            assert torch.equal(fused(x), expected)
            assert attn.fused_q_proj_k_proj_v_proj._cache is None  # dropped after use
            counts: list[int] = []
            torch._dynamo.reset()
            out = torch.compile(fused, backend=nm_linear_calls(counts), fullgraph=True)(x)
            assert torch.equal(out, expected)
            torch._dynamo.reset()
            torch.compile(plain, backend=nm_linear_calls(counts), fullgraph=True)(x)
            # one op per group: 2 layers × (qkv, o, gate/up, down) against 2 × 7 unfused
            assert counts == [8, 14]
    torch._dynamo.reset()
    with torch.no_grad():  # inductor, fused against unfused (both compiled, fullgraph)
        torch.testing.assert_close(torch.compile(fused, fullgraph=True)(x),
                                   torch.compile(plain, fullgraph=True)(x),
                                   rtol=1e-6 if dtype == torch.float32 else 1e-2, atol=1e-6)
    torch._dynamo.reset()


class Reuse(nn.Module):
    """Siblings called on an input changed in place between them, or on other inputs."""

    def __init__(self, inplace: bool = True) -> None:
        super().__init__()
        self.inplace = inplace
        self.gate_proj = nn.Linear(64, 32)
        self.up_proj = nn.Linear(64, 40)  # ragged last: 40 is not a multiple of L = 16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * 1
        gate = self.gate_proj(x)
        if self.inplace:
            x.mul_(2)
        return torch.cat([gate, self.up_proj(x), self.gate_proj(x)], dim=-1)


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode],
                         ids=["no_grad", "inference_mode"])
def test_an_input_changed_in_place_between_siblings_is_not_served_stale(grad_mode):
    torch.manual_seed(6)
    plain = Reuse()
    nmnn.sparsify(plain, PATTERN, VEC)
    fused = copy.deepcopy(plain)
    assert [g.out_features for g in nmnn.fuse_siblings(fused, [("gate_proj", "up_proj")])
            .fused] == [(32, 40)]
    holder = fused.fused_gate_proj_up_proj
    x = torch.randn(3, 64)
    with grad_mode():
        expected = plain(x)
        assert torch.equal(fused(x), expected)
        assert holder._cache is None  # the parent's hook drops what was left
        # called directly: another input, a changed input, a sibling called twice
        y = torch.randn(3, 64)
        assert torch.equal(fused.gate_proj(x), plain.gate_proj(x))
        assert torch.equal(fused.up_proj(y), plain.up_proj(y))
        assert torch.equal(fused.gate_proj(y), plain.gate_proj(y))
        y.add_(1)
        assert torch.equal(fused.up_proj(y), plain.up_proj(y))
        assert torch.equal(fused.up_proj(y), plain.up_proj(y))
        holder.drop()
        # compiled whole: the comparison dynamo cannot prove is an error, never stale
        for fullgraph in (True, False):
            torch._dynamo.reset()
            with pytest.raises(torch._dynamo.exc.Unsupported, match="[Dd]ata pointer"):
                torch.compile(fused, fullgraph=fullgraph)(x)
        holder.drop()
        fused.inplace = plain.inplace = False
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(fused, fullgraph=True)(x), plain(x),
                                   rtol=1e-6, atol=1e-6)
    torch._dynamo.reset()


def test_eager_sharing_is_keyed_on_the_input_object_and_its_version():
    _, fused = decoders()
    mlp = fused.layers[0]["mlp"]
    holder = mlp.fused_gate_proj_up_proj
    calls = []
    holder.register_forward_hook(lambda module, args, out: calls.append(1))
    x = torch.randn(4, 64)
    with torch.no_grad():
        mlp.gate_proj(x)
        assert holder._cache is not None and holder._cache[0] is x
        mlp.up_proj(x)
        assert len(calls) == 1 and holder._cache is None  # one product for both
        mlp.gate_proj(x)
        mlp.up_proj(x.clone())  # another tensor of the same values: computed again
        assert len(calls) == 3
        # called outside the parent, whose forward hook drops what is left
        assert holder._cache is not None
        mlp(x)
        assert len(calls) == 4 and holder._cache is None
    with torch.inference_mode():  # inference tensors keep no version: each runs apart
        x = torch.randn(4, 64)
        mlp.gate_proj(x)
        mlp.up_proj(x)
        assert len(calls) == 4 and holder._cache is None


def test_groups_that_cannot_fuse_are_reported_and_left_as_they_are():
    torch.manual_seed(7)
    model = nn.ModuleDict({
        "a": Attention(),                       # v_proj left dense below
        "b": LlamaMlp(),                        # fuses
        "c": nn.ModuleDict({"gate_proj": nn.Linear(64, 40), "up_proj": nn.Linear(64, 48)}),
        "d": nn.ModuleDict({"gate_proj": nn.Linear(64, 32, bias=False),
                            "up_proj": nn.Linear(64, 32)}),
        "e": nn.ModuleDict({"up_proj": nn.Linear(64, 32)}),
        "f": LlamaMlp(),                        # a hook on gate_proj
        "g": nn.ModuleDict({"gate_proj": nn.Linear(64, 32), "up_proj": nn.Linear(80, 32)}),
    })
    nmnn.sparsify(model["f"], PATTERN, VEC)
    model["f"].gate_proj.register_forward_hook(lambda module, args, out: None)
    summary = nmnn.sparsify(model, PATTERN, VEC, exclude="a.v_proj",
                            siblings=nmnn.LLAMA_SIBLINGS)
    assert [g.holder for g in summary.fused_groups] == ["b.fused_gate_proj_up_proj"]
    reasons = {g.parent: g.reason for g in summary.unfused_groups}
    assert reasons["a"] == "v_proj is a Linear, not a SparseLinear"
    assert reasons["c"].startswith("out_features of gate_proj not a multiple of L = 16")
    assert reasons["d"] == "bias differs: False, True"
    assert reasons["e"] == "no gate_proj in ModuleDict"
    assert reasons["g"] == "in_features differs: 64, 80"
    assert reasons["f"] == "gate_proj has forward hooks (a fused layer would not call them)"
    assert set(reasons) == {"a", "c", "d", "e", "f", "g"}
    assert "siblings not fused d.{gate_proj, up_proj}: bias differs" in str(summary)
    assert all(type(model[p][n]) is nmnn.SparseLinear for p in "cdg"
               for n in ("gate_proj", "up_proj"))
    again = nmnn.fuse_siblings(model)
    assert {g.parent: g.reason for g in again.skipped}["b"] == "gate_proj is fused already"
    with pytest.raises(ValueError, match="two or more distinct"):
        nmnn.fuse_siblings(model, [("q_proj",)])


def test_a_fused_model_saves_and_loads_as_the_unfused_one(tmp_path):
    pytest.importorskip("safetensors")
    plain, fused = decoders(torch.bfloat16)
    state = fused.state_dict()
    reference = plain.state_dict()
    assert set(state) == set(reference)  # the holders' buffers are not state
    assert all(torch.equal(state[k], v) for k, v in reference.items())
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = fused(x)
    path = tmp_path / "fused.safetensors"
    nmnn.save_sparse(fused, path)
    for source in (state, path):
        torch.manual_seed(11)
        fresh = Decoder().to(torch.bfloat16)  # dense, other weights
        names = nmnn.load_sparse(fresh, source, siblings=nmnn.LLAMA_SIBLINGS)
        assert len(names) == 14
        assert isinstance(fresh.layers[1]["mlp"].up_proj, nmnn.FusedSlice)
        with torch.no_grad():
            assert torch.equal(fresh(x), expected)
    # into a fused model of other weights: the columns are written into the holders
    _, other = decoders(torch.bfloat16, seed=12)
    nmnn.load_sparse(other, path)
    other.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(other(x), expected)
    # a state of another shape is refused with what to do
    bad = dict(state)
    bad["layers.0.self_attn.k_proj.nm_meta"] = torch.tensor([8, 32, 16, 64, 48])
    with pytest.raises(RuntimeError, match="a fused sibling: nmgen.nn.load_sparse into the"):
        other.load_state_dict(bad)
    with pytest.raises(ValueError, match="load into the unfused model, then fuse_siblings"):
        nmnn.load_sparse(other, bad)


def test_fused_siblings_copy_move_and_densify():
    plain, fused = decoders()
    x = torch.randn(2, 3, 64)
    with torch.no_grad():
        expected = fused(x)
        twin = copy.deepcopy(fused)
        attn = twin.layers[0]["self_attn"]
        assert attn.k_proj.holder is attn.fused_q_proj_k_proj_v_proj
        assert torch.equal(twin(x), expected)
        half = copy.deepcopy(fused).to(torch.bfloat16)
        assert rel_err(half(x.to(torch.bfloat16)), expected) < RTOL[torch.bfloat16]
        k = fused.layers[0]["self_attn"].k_proj
        assert torch.equal(k.dense_weight(), plain.layers[0]["self_attn"].k_proj.dense_weight())
        assert torch.equal(k.to_linear()(x), plain.layers[0]["self_attn"].k_proj.to_linear()(x))
