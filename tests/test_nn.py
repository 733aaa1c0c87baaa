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
