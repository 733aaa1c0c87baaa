"""GPU: nmgen.nn on CUDA. SparseLinear through nmgen.dispatch in bf16 and fp32 at M = 1, 7
and 300 with leading batch shapes, on NaN-poisoned output memory, against the float64
product of the pruned weight; with every activation and the bias in the kernels' epilogue
(fp16 too); a sparsified model (its GELU fused into the first layer) under torch.compile
(fullgraph), under mode="reduce-overhead" (CUDA graph trees) replayed on new inputs, and
captured by hand into a torch.cuda.CUDAGraph."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import nmgen.nn as nmnn  # noqa: E402

pytestmark = pytest.mark.gpu

K, HIDDEN, N = 333, 512, 257  # K and N off the multiples of m and L: padded inside
PATTERN, VEC = "8:32", 128
SHAPES = {1: (1, 1, K), 7: (7, K), 300: (3, 100, K)}  # M rows, with leading batch shapes
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
# Relative Frobenius error against float64. One layer: float32 sums in another order;
# bfloat16 rounds the product and then the sum with the bias (2**-9 relative each).
# Two layers: the hidden activations are rounded to the dtype as well.
LAYER_RTOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3}
MODEL_RTOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    torch._dynamo.reset()  # each test compiles its own model from scratch


def make_layer(dtype: torch.dtype) -> nmnn.SparseLinear:
    torch.manual_seed(0)
    linear = torch.nn.Linear(K, N, device="cuda", dtype=dtype)
    return nmnn.SparseLinear.from_dense(linear, PATTERN, VEC, name="layer")


def make_model(dtype: torch.dtype) -> torch.nn.Sequential:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(K, HIDDEN), torch.nn.GELU(),
                                torch.nn.Linear(HIDDEN, N, bias=False))
    model = model.to(device="cuda", dtype=dtype)
    summary = nmnn.sparsify(model, PATTERN, VEC)
    assert len(summary.replaced) == 2 and model[0].activation == "gelu", str(summary)
    return model


ACTIVATIONS = {"none": lambda x: x, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
               "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
               "silu": torch.nn.functional.silu}


def layer_reference(layer: nmnn.SparseLinear, x: torch.Tensor) -> torch.Tensor:
    out = x.double() @ layer.dense_weight().double().T
    out = out if layer.bias is None else out + layer.bias.double()
    return ACTIVATIONS[layer.activation](out)


def model_reference(model: torch.nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    hidden = layer_reference(model[0], x)  # its GELU fused
    return hidden @ model[2].dense_weight().double().T


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def random_input(rows: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(SHAPES[rows], device="cuda").to(dtype)


def poison(numel: int, dtype: torch.dtype) -> None:
    """Leave a freed NaN block of an output's size in torch's caching allocator, which
    hands it out for the next allocation of that size: an output left unwritten shows."""
    torch.full((numel,), float("nan"), dtype=dtype, device="cuda")


@pytest.mark.parametrize("rows", list(SHAPES))
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_layer_matches_the_float64_product(dtype, rows, gpu_cases):
    layer = make_layer(dtype)
    x = random_input(rows, dtype)
    poison(rows * N, dtype)
    with torch.inference_mode():
        out = layer(x)
    torch.cuda.synchronize()
    assert out.shape == (*x.shape[:-1], N) and out.dtype == dtype and out.is_cuda
    assert not bool(out.isnan().any()), "output left unwritten"
    assert rel_err(out, layer_reference(layer, x)) < LAYER_RTOL[dtype]
    gpu_cases["kernel_cases"] += 1


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["f32", "bf16", "f16"])
def test_layer_epilogue_matches_the_float64_product(dtype, activation, bias, gpu_cases):
    """Bias and activation in the kernels' epilogue, rounded once: decode M (gemv) and
    prefill M (mma or f32), poisoned output."""
    torch.manual_seed(1)
    linear = torch.nn.Linear(K, N, bias=bias, device="cuda", dtype=dtype)
    layer = nmnn.SparseLinear.from_dense(linear, PATTERN, VEC, activation=activation)
    for rows in SHAPES:
        x = random_input(rows, dtype)
        poison(rows * N, dtype)
        with torch.inference_mode():
            out = layer(x)
        torch.cuda.synchronize()
        assert not bool(out.isnan().any()), "output left unwritten"
        rtol = LAYER_RTOL.get(dtype, 2e-3)  # float16 rounds at 2**-11
        assert rel_err(out, layer_reference(layer, x)) < rtol, (activation, rows)
        gpu_cases["kernel_cases"] += 1


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_sparsified_model_matches_the_dense_pruned_model(dtype, gpu_cases):
    model = make_model(dtype)
    with torch.no_grad():
        for rows in SHAPES:
            x = random_input(rows, dtype)
            assert rel_err(model(x), model_reference(model, x)) < MODEL_RTOL[dtype]
            gpu_cases["kernel_cases"] += 2


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_fullgraph_compile_matches_eager(dtype):
    model = make_model(dtype)
    compiled = torch.compile(model, fullgraph=True)
    with torch.inference_mode():
        for rows in (7, 300):
            x = random_input(rows, dtype)
            assert rel_err(compiled(x), model(x)) < LAYER_RTOL[dtype]


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_reduce_overhead_replays_match_eager(dtype):
    """CUDA graph trees: a warm-up run, a recording, then replays, each on new inputs;
    none of the graphs is skipped."""
    from torch._dynamo.utils import counters

    model = make_model(dtype)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    counters.clear()
    with torch.inference_mode():
        for _ in range(5):
            x = random_input(7, dtype)
            torch.compiler.cudagraph_mark_step_begin()
            out = compiled(x).clone()
            assert rel_err(out, model(x)) < LAYER_RTOL[dtype]
            assert rel_err(out, model_reference(model, x)) < MODEL_RTOL[dtype]
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_cuda_graph_capture_replays_new_inputs(dtype, gpu_cases):
    model = make_model(dtype)
    x = random_input(300, dtype)
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up on a side stream, as torch asks
            model(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(x)
        for _ in range(2):
            x.copy_(random_input(300, dtype))
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert not bool(out.isnan().any()), "the replay left output unwritten"
            assert rel_err(out, model_reference(model, x)) < MODEL_RTOL[dtype]
            gpu_cases["kernel_cases"] += 2


def test_moved_to_the_gpu_and_loaded_from_a_state_dict():
    """Sparsified on the CPU then moved (the layers hand their weight to the op again),
    and a fresh dense model loaded from the state: the same outputs as the CPU reference
    and as each other."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(K, HIDDEN), torch.nn.GELU(),
                                torch.nn.Linear(HIDDEN, N, bias=False))
    nmnn.sparsify(model, PATTERN, VEC)
    x = torch.randn(SHAPES[7])
    with torch.no_grad():
        on_cpu = model(x)
        model.cuda()
        on_gpu = model(x.cuda())
        assert rel_err(on_gpu.cpu(), on_cpu) < LAYER_RTOL[torch.float32]
        torch.manual_seed(1)
        fresh = torch.nn.Sequential(torch.nn.Linear(K, HIDDEN), torch.nn.GELU(),
                                    torch.nn.Linear(HIDDEN, N, bias=False)).cuda()
        assert sorted(nmnn.load_sparse(fresh, model.state_dict())) == ["0", "2"]
        assert rel_err(fresh(x.cuda()), on_gpu) < LAYER_RTOL[torch.float32]
