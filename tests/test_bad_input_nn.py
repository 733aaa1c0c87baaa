"""Bad input to the PyTorch side (``nmgen.prune`` of tensors, ``nmgen.nn``): a clear error
that names the problem, never a silent change of the user's weights or choices. Each row
here is a row of docs/bad-input.md."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import nmgen  # noqa: E402
import nmgen.nn as nmnn  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "bad-input.md").read_text()


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32))


def sparse(pattern: str = "2:4") -> nn.Sequential:
    net = model()
    nmnn.sparsify(net, pattern, 16)
    return net


def state(**changes) -> dict:
    """A sparsified model's state, with keys replaced (a value of None: dropped)."""
    result = sparse().state_dict()
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            result.pop(key)
        else:
            result[key] = value
    return result


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(64, 64) for _ in range(3))

    def forward(self, x):
        return self.q_proj(x) + self.k_proj(x) + self.v_proj(x)


def fused() -> Attention:
    net = Attention()
    nmnn.sparsify(net, "2:4", 16, siblings=nmnn.LLAMA_SIBLINGS)
    return net


def nan_bias() -> nn.Linear:
    linear = nn.Linear(64, 64)
    with torch.no_grad():
        linear.bias[0] = float("nan")
    return linear


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# (the row of docs/bad-input.md, the call (given a temporary folder), the exception it
# raises, what its message says)
CASES = [
    ("`prune` of a PyTorch weight without `layout`",
     lambda t: nmgen.prune(nn.Linear(64, 64).weight, "2:4", 16), ValueError,
     "a PyTorch weight needs layout=: 'nk' for an nn.Linear weight"),
    ("`from_compressed` of PyTorch tensors without `layout`",
     lambda t: nmgen.NMMatrix.from_compressed(torch.zeros(32, 32), torch.zeros(32, 2,
                                              dtype=torch.uint8) + torch.tensor([[0], [1]] * 16,
                                              dtype=torch.uint8), "2:4", 16, (64, 32)),
     ValueError, "a PyTorch weight needs layout="),
    ("`prune` of a tensor on the meta device",
     lambda t: nmgen.prune(torch.ones(8, 8, device="meta"), "2:4", 4, layout="nk"),
     ValueError, "a tensor on the meta device holds no values"),
    ("a second `sparsify` with another pattern or L",
     lambda t: nmnn.sparsify(sparse("2:4"), "1:4", 16), ValueError,
     "0: sparsified already as 2:4 L=16, not 1:4 L=16"),
    ("`sparsify` of a fused model with another pattern",
     lambda t: nmnn.sparsify(fused(), "1:4", 16), ValueError,
     "q_proj: sparsified already as 2:4 L=16"),
    ("`sparsify(include=...)` matching no layer",
     lambda t: nmnn.sparsify(model(), "2:4", 16, include="nope.*"), ValueError,
     "include='nope.*' matches none of the model's 2 Linear layers"),
    ("`sparsify(include=3)` (not a selector)",
     lambda t: nmnn.sparsify(model(), "2:4", 16, include=3), TypeError,
     "include=3: expected a glob of layer names"),
    ("`sparsify` of something not an `nn.Module`",
     lambda t: nmnn.sparsify("model", "2:4", 16), TypeError,
     "model: expected a torch.nn.Module, got str"),
    ("`sparsify(siblings=\"qkv\")` (a string for groups)",
     lambda t: nmnn.sparsify(model(), "2:4", 16, siblings="qkv"), TypeError,
     "groups 'qkv': expected groups of child names"),
    ("`fuse_siblings` of a group given as a string",
     lambda t: nmnn.fuse_siblings(sparse(), ["01"]), TypeError,
     "group '01': expected a tuple of child names"),
    ("`load_sparse` into a model sparsified with another pattern",
     lambda t: nmnn.load_sparse(sparse("1:4"), state()), ValueError,
     "0: the model's layer is sparsified as (n, m, L, in, out) = (1, 4, 16, 64, 64)"),
    ("`load_sparse(strict=False)` of values without their indices",
     lambda t: nmnn.load_sparse(model(), state(**{"0__indices": None}), strict=False),
     RuntimeError, "the state holds values without indices"),
    ("`load_sparse(strict=False)` of compressed tensors without `nm_meta`",
     lambda t: nmnn.load_sparse(model(), state(**{"0__nm_meta": None}), strict=False),
     ValueError, "0.indices: compressed indices without their layer's nm_meta"),
    ("`nm_meta` of floats, e.g. `[2.5, 4, 16, 64, 64]`",
     lambda t: nmnn.load_sparse(model(), state(**{"0__nm_meta": torch.tensor(
         [2.5, 4, 16, 64, 64])})), ValueError, "expected 5 integers [n, m, L, in, out]"),
    ("`nm_meta` not 1-D",
     lambda t: nmnn.load_sparse(model(), state(**{"0__nm_meta": torch.ones(
         5, 5, dtype=torch.int64)})), ValueError, "got a (5, 5) torch.int64 tensor"),
    ("a state whose bias holds NaN or inf",
     lambda t: nmnn.load_sparse(model(), state(**{"0__bias": torch.full((64,), float(
         "nan"))})), RuntimeError, "the bias holds 64 non-finite values"),
    ("`load_sparse` of a file that is not safetensors",
     lambda t: nmnn.load_sparse(model(), write(t / "x.safetensors", "hello")), ValueError,
     "not a safetensors file"),
    ("`load_sparse` of a directory", lambda t: nmnn.load_sparse(model(), t),
     IsADirectoryError, "a directory, not a safetensors file"),
    ("`load_sparse` into a model lacking the layer",
     lambda t: nmnn.load_sparse(nn.Sequential(), state()), ValueError,
     "0: the state holds a sparse layer there; the model has no such module"),
    ("`save_sparse` into a missing folder",
     lambda t: nmnn.save_sparse(sparse(), t / "no" / "m.safetensors"), FileNotFoundError,
     "its directory"),
    ("`SparseLinear.from_dense` of a module other than `nn.Linear`",
     lambda t: nmnn.SparseLinear.from_dense(nn.Conv1d(3, 3, 1), "2:4", 16), TypeError,
     "expected an nn.Linear, got Conv1d"),
    ("`SparseLinear.from_dense` of a layer whose bias holds NaN",
     lambda t: nmnn.SparseLinear.from_dense(nan_bias(), "2:4", 16), ValueError,
     "the bias holds 1 non-finite values"),
    ("`SparseLinear.set_matrix` of something not an `NMMatrix`",
     lambda t: nmnn.SparseLinear(64, 64, "2:4", 16).set_matrix(np.ones((64, 64))), TypeError,
     "expected an nmgen.NMMatrix"),
    ("`SparseLinear(64.0, ...)` (features not integers)",
     lambda t: nmnn.SparseLinear(64.0, 64, "2:4", 16), TypeError,
     "in_features = 64.0: expected an integer"),
    ("`SparseLinear` with `vec=10**12`",
     lambda t: nmnn.SparseLinear(64, 64, "2:4", 10**12), ValueError,
     "must be at most 2147483647"),
    ("`SparseLinear` with L far beyond its out_features",
     lambda t: nmnn.SparseLinear(64, 64, "2:4", 5000), ValueError,
     "longer than the weight's N = 64 columns"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_nn_refuses_bad_input_clearly(case, tmp_path):
    what, call, error, says = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(error) as raised:
            call(tmp_path)
    assert says in str(raised.value)
    assert f"| {what} |" in DOC, f"docs/bad-input.md lacks the row {what!r}"


def test_a_square_torch_weight_multiplies_as_its_layout_says():
    """The product the layout rule protects: ``layout="nk"`` of ``[out, in]`` is ``x @ w.T``."""
    w = torch.randn(64, 64)
    b = nmgen.prune(w, "4:4", 16, layout="nk")  # 4:4 keeps everything: the dense product
    x = np.random.default_rng(1).standard_normal((3, 64))
    np.testing.assert_allclose(nmgen.reference(x, b), x @ w.double().numpy().T, rtol=1e-6)
    assert "| `prune` of a PyTorch weight without `layout` |" in DOC


def test_from_compressed_takes_the_transposed_form_with_layout_nk():
    b = nmgen.prune(np.random.default_rng(0).standard_normal((64, 48)), "2:4", 16)
    values, indices = torch.from_numpy(np.array(b.values)), torch.from_numpy(np.array(b.indices))
    kn = nmgen.NMMatrix.from_compressed(values, indices, "2:4", 16, (64, 48), layout="kn")
    nk = nmgen.NMMatrix.from_compressed(values.T, indices.T, "2:4", 16, (48, 64), layout="nk")
    np.testing.assert_array_equal(kn.to_dense(), b.to_dense())
    np.testing.assert_array_equal(nk.to_dense(), b.to_dense())
    assert "| `from_compressed(..., layout=\"nk\")` |" in DOC


def test_a_dtype_given_as_a_torch_dtype_is_taken():
    w = np.ones((8, 8), np.float32)
    assert nmgen.prune(w, "2:4", 4, dtype=torch.float16).dtype is nmgen.DType.F16
    assert nmgen.prune(w, "2:4", 4, dtype=torch.bfloat16).dtype is nmgen.DType.BF16
    assert "| `dtype=np.float16` or `torch.float16` (a dtype, not its name) |" in DOC


def test_a_second_sparsify_with_the_same_choice_says_so():
    summary = nmnn.sparsify(sparse("2:4"), "2:4", 16)
    assert [s.reason for s in summary.skipped] == ["sparsified already (2:4 L=16)"] * 2
    assert "| a second `sparsify` with the same pattern and L |" in DOC


def test_load_sparse_with_strict_false_says_what_it_left_out():
    extra = state(junk=torch.zeros(3))
    with pytest.warns(UserWarning, match=r"load_sparse\(strict=False\): no keys of the model "
                      r"missing from the state \(left as they were\), 1 keys \(junk\)"):
        nmnn.load_sparse(model(), extra, strict=False)
    assert "| `load_sparse(strict=False)` of a state with keys the model lacks, or the other "\
        "way round |" in DOC


def test_sparsify_skips_a_layer_whose_bias_is_not_finite():
    net = model()
    with torch.no_grad():
        net[0].bias[3] = float("inf")
    summary = nmnn.sparsify(net, "2:4", 16)
    assert [s.name for s in summary.skipped] == ["0"]
    assert "non-finite" in summary.skipped[0].reason
    assert "| `SparseLinear.from_dense` of a layer whose bias holds NaN |" in DOC
