"""GPU: generated kernels against the float64 reference, on fresh random data.

Every case draws a configuration, pattern and shape at random (odd K and N, M including
1, 3, 17, 255 and 1000), poisons the output with NaN, launches, and compares with
``nmgen.reference`` computed in float64 from the compressed form.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

import nmgen
from nmgen.families.f32_simt import F32_SIMT
from nmgen.families.f32_simt.copy_plan import copy_chunk_rows
from nmgen.problem import ALayout, Problem

from .gpu_suite import SEED

pytestmark = pytest.mark.gpu

PATTERNS = [(2, 4), (1, 4), (2, 8), (4, 8), (4, 16), (8, 16), (16, 32), (12, 32), (8, 32),
            (4, 32), (16, 64), (8, 64), (3, 7)]
VECS = [8, 16, 32, 64, 128, 8, 16, 32, 4, 1]
M_EDGES = [1, 3, 17, 255, 1000]
CONFIGS = 64
SHAPES_PER_CONFIG = 5
RTOL = 1e-5


def relative_error(out, ref) -> float:
    import cupy as cp

    out64 = cp.asarray(out, dtype=cp.float64)
    return float(cp.linalg.norm(out64 - ref) / max(float(cp.linalg.norm(ref)), 1e-30))


def make_a(rng: np.random.Generator, m_rows: int, k: int, layout: ALayout):
    """Random logical M×K operand in the kernel's layout (K-major: a K×M array, viewed .T)."""
    import cupy as cp

    if layout is ALayout.ROW_MAJOR:
        return cp.asarray(rng.standard_normal((m_rows, k), dtype=np.float32))
    return cp.asarray(rng.standard_normal((k, m_rows), dtype=np.float32)).T


def check_case(kernel: nmgen.Kernel, rng: np.random.Generator, m_rows: int, k: int,
               n_cols: int) -> float:
    import cupy as cp

    c = kernel.config
    w = rng.standard_normal((k, n_cols), dtype=np.float32)
    b = nmgen.prune(w, (c.n, c.m), c.vec)
    a = make_a(rng, m_rows, k, c.a_layout)
    out = cp.full((m_rows, n_cols), cp.nan, cp.float32)  # poison: unwritten shows as NaN
    kernel(a, b, out=out)
    cp.cuda.Device().synchronize()
    ref = nmgen.reference(a, b)
    assert not bool(cp.isnan(out).any()), "output left unwritten (NaN poison survived)"
    return relative_error(out, ref)


def check_shapes(kernel: nmgen.Kernel, shapes, gpu_cases) -> None:
    """``check_case`` on every (M, K, N) of ``shapes``, each within RTOL."""
    rng = np.random.default_rng(SEED)
    for m_rows, k, n_cols in shapes:
        err = check_case(kernel, rng, m_rows, k, n_cols)
        assert err < RTOL, (f"{kernel.config.name} M={m_rows} K={k} N={n_cols}: relative "
                            f"error {err:.3g} (seed {SEED})")
        gpu_cases["kernel_cases"] += 1


EDGES = [(m, 333, 257) for m in M_EDGES]  # the M edges, odd K and N


def random_config(case: int) -> tuple[nmgen.KernelConfig, random.Random]:
    """Case ``case``'s configuration, and the generator that then draws its shapes (the
    GPU suite compiles the configurations ahead: ``tests/gpu_suite.py``)."""
    pick = random.Random(SEED * 1000 + case)
    n, m = pick.choice(PATTERNS)
    problem = Problem(n, m, pick.choice(VECS), a_layout=pick.choice(list(ALayout)))
    return F32_SIMT.space.sample(problem, pick), pick


@pytest.mark.parametrize("case", range(CONFIGS))
def test_random_config_matches_reference(case, gpu_cases):
    config, pick = random_config(case)
    rng = np.random.default_rng(SEED * 1000 + case)
    kernel = nmgen.Kernel(config)
    for i in range(SHAPES_PER_CONFIG):
        m_rows = M_EDGES[(case + i) % len(M_EDGES)] if i < 3 else pick.randint(1, 300)
        k = pick.randint(1, 400) | 1  # odd K
        n_cols = pick.randint(1, 300) | 1  # odd N
        err = check_case(kernel, rng, m_rows, k, n_cols)
        assert err < RTOL, (f"{config.name} M={m_rows} K={k} N={n_cols}: relative error "
                            f"{err:.3g} (seed {SEED})")
        gpu_cases["kernel_cases"] += 1


@pytest.mark.parametrize("layout", list(ALayout))
@pytest.mark.parametrize("packing", [False, True])
def test_llama_size_problem(layout, packing, gpu_cases):
    """A large K (long fp32 accumulation) with the benchmark's tile shapes."""
    config = nmgen.KernelConfig(8, 32, 32, 128, 128, 64, 8, 8, packing=packing,
                                a_layout=layout)
    rng = np.random.default_rng(SEED)
    err = check_case(nmgen.Kernel(config), rng, 1000, 4096 + 13, 1536 + 5)
    assert err < RTOL, f"{config.name}: relative error {err:.3g} (seed {SEED})"
    gpu_cases["kernel_cases"] += 1


def test_two_versions_of_one_configuration_run_their_own_code(gpu_cases):
    """The A/B tools time template variants under one name on one weight: the launch plan
    cached on the weight must follow the source, not the name."""
    import cupy as cp

    config = nmgen.KernelConfig(8, 32, 32, 64, 128, 64, 8, 8)
    source = nmgen.Kernel(config).source
    zero = "acc[i][j] = 0.0f;"
    assert source.code.count(zero) == 1, "the accumulator reset this test rewrites moved"
    plus_one = replace(source, code=source.code.replace(zero, "acc[i][j] = 1.0f;"))
    rng = np.random.default_rng(SEED)
    b = nmgen.prune(rng.standard_normal((256, 130), dtype=np.float32), (8, 32), 32)
    a = make_a(rng, 70, 256, ALayout.ROW_MAJOR)
    outs = []
    for kernel in (nmgen.Kernel(config), nmgen.Kernel(config, plus_one), nmgen.Kernel(config)):
        out = cp.full((70, 130), cp.nan, cp.float32)
        outs.append(kernel(a, b, out=out))
    ref = nmgen.reference(a, b)
    assert relative_error(outs[0], ref) < RTOL and relative_error(outs[2], ref) < RTOL
    assert relative_error(outs[1] - 1.0, ref) < RTOL, "the variant's plan was not its own"
    gpu_cases["kernel_cases"] += 3


@pytest.mark.parametrize(("split_k", "packing"), [(1, False), (3, True)])
def test_copied_a_tile_matches_reference(split_k, packing, gpu_cases):
    """Row-major A copied K-major by the transpose kernel first ("tx"): a workspace a
    call, M not a multiple of 4, odd K and N."""
    config = nmgen.KernelConfig(8, 32, 32, 64, 128, 64, 8, 8, packing=packing,
                                split_k=split_k, a_tile="tx")
    check_shapes(nmgen.Kernel(config), EDGES, gpu_cases)


PIPELINED = [  # copied A (tx) kernels whose copies run pipelined in chunks of M
    dict(ms=64, ns=256, ks=64, mt=16, nt=4, warp_m=4, warp_n=8, stages=2, tma=True),
    dict(ms=128, ns=256, ks=64, mt=16, nt=8, stages=3),
]


def chunk_rows(kernel: nmgen.Kernel, b, a_op, lda: int) -> int:
    """The rows of the chunks a pipelined call cuts M in on this GPU (0: none pays): the
    family's rule on the main launch's block columns and the blocks of it the GPU holds
    at once, read from the plan of M = 4 (they do not depend on M)."""
    from nmgen.runtime.device import device_info

    c = kernel.config
    main = next(x for x in kernel._bound(b, a_op, 4, lda).plan.launches if x.entry == c.name)
    per_sm = kernel._resident_blocks(a_op.device)(main.entry, main.threads, main.smem)
    return int(copy_chunk_rows(b.shape[0], c.ms, main.grid[0], device_info().sms * per_sm))


def pipelined_case(config, kind: str, stream_kind: str, pad: int = 0):
    """(kernel, b, a, out, stream) for a copied-A kernel at an M that it runs in chunks:
    three whole chunks and a last one of half a chunk plus 37 rows (asserted, else the test
    would not test the pipeline); K and N odd, so A's rows are not 16-byte aligned; with
    ``pad``, A's rows lie K + pad floats apart (a column slice of a wider array)."""
    import cupy as cp

    from nmgen.runtime.device import operand

    kernel = nmgen.Kernel(config)
    rng = np.random.default_rng(SEED)
    k_dim, n_cols = 4096 + 13, 4096 + 13
    b = nmgen.prune(rng.standard_normal((k_dim, n_cols), dtype=np.float32),
                    (config.n, config.m), config.vec)
    probe = operand(cp.empty(4, cp.float32), "a")  # the plan needs only the device
    rows = chunk_rows(kernel, b, probe, k_dim)  # a chunk on this GPU
    m_rows = 3 * rows + rows // 2 + 37
    a = cp.asarray(rng.standard_normal((m_rows, k_dim + pad), dtype=np.float32))[:, :k_dim]
    chunks = kernel._bound(b, operand(a, "a"), m_rows, k_dim + pad).plan.chunks
    assert list(chunks) == [rows] * 3 + [rows // 2 + 37], chunks
    out = cp.full((m_rows, n_cols), cp.nan, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True) if stream_kind == "side" else None
    if kind == "torch":
        torch = pytest.importorskip("torch")
        a, out = torch.as_tensor(a, device="cuda"), torch.as_tensor(out, device="cuda")
        stream = torch.cuda.Stream() if stream_kind == "side" else None
    return kernel, b, a, out, stream


@pytest.mark.parametrize(("shape", "pad"), [(PIPELINED[0], 0), (PIPELINED[1], 0),
                                           (PIPELINED[0], 3)])
def test_pipelined_copy_matches_reference_and_the_single_copy(shape, pad, gpu_cases):
    """Chunk j's copy overlapping chunk j-1's main kernel gives the float64 answer, and
    the same bits as one copy then one main kernel (every block computes as before); also
    for A whose rows are further apart than K."""
    import cupy as cp

    config = nmgen.KernelConfig(8, 32, 32, **shape, a_tile="tx")
    if config.tma and cp.cuda.Device().compute_capability != "90":
        pytest.skip("the bulk copy engine is sm_90's")
    kernel, b, a, out, _ = pipelined_case(config, "cupy", "current", pad)
    kernel(a, b, out=out)
    cp.cuda.Device().synchronize()
    assert not bool(cp.isnan(out).any()), "a chunk left unwritten (NaN poison survived)"
    assert relative_error(out, nmgen.reference(a, b)) < RTOL
    kernel.pipeline = False
    single = kernel(a, b)
    cp.cuda.Device().synchronize()
    assert bool((single == out).all()), "pipelined and single-copy outputs differ"
    gpu_cases["kernel_cases"] += 2


@pytest.mark.parametrize("kind", ["cupy", "torch"])
def test_pipelined_copy_is_ordered_on_the_callers_stream(kind, gpu_cases):
    """Work queued on the caller's side stream after the call sees the whole product
    (the side stream waits for the last main kernels), with no device-wide sync."""
    import cupy as cp

    config = nmgen.KernelConfig(8, 32, 32, **PIPELINED[0], a_tile="tx")
    if cp.cuda.Device().compute_capability != "90":
        config = config.replace(tma=False)
    kernel, b, a, out, stream = pipelined_case(config, kind, "side")
    if kind == "torch":
        torch = pytest.importorskip("torch")
        with torch.cuda.stream(stream):
            kernel(a, b, out=out)
            after = out.clone()  # queued on the side stream behind the call
        stream.synchronize()
        after, a = cp.asarray(after), cp.asarray(a)
    else:
        with stream:
            kernel(a, b, out=out, stream=stream)
            after = out.copy()
        stream.synchronize()
    assert not bool(cp.isnan(after).any()), "the caller's stream ran ahead of the chunks"
    assert relative_error(after, nmgen.reference(a, b)) < RTOL
    gpu_cases["kernel_cases"] += 1


SLICED = [  # (slice_k, A layout, A tile, packing, split_k, stages)
    (2, "km", "tk", False, 1, 2), (4, "km", "tk", True, 2, 3), (4, "rm", "tx", False, 1, 2),
    (2, "rm", "tx", True, 3, 1), (2, "rm", "tm", False, 2, 2), (4, "rm", "tk", False, 1, 3),
    (2, "rm", "tk", True, 1, 2),
]


@pytest.mark.parametrize(("slice_k", "layout", "tile", "packing", "split_k", "stages"), SLICED)
def test_sliced_k_matches_reference(slice_k, layout, tile, packing, split_k, stages, gpu_cases):
    """Sliced K (slices of a block split every stage's rows, then add up in shared
    memory) on every A tile that allows it, with packing, split-K and each pipeline depth;
    the M edges, odd K and N, and a long K."""
    config = nmgen.KernelConfig(8, 32, 32, 32, 64, 128, 4, 4, warp_m=4, warp_n=8,
                                packing=packing, split_k=split_k, stages=stages,
                                slice_k=slice_k, a_layout=layout, a_tile=tile)
    kernel = nmgen.Kernel(config)
    check_shapes(kernel, [*EDGES, (300, 4096 + 13, 131)], gpu_cases)


STREAM_K = [  # (A layout, A tile, packing, stages, MS, NS, MT, NT)
    ("km", "tk", False, 2, 128, 256, 16, 8), ("km", "tk", True, 3, 64, 128, 8, 8),
    ("rm", "tx", False, 2, 64, 64, 8, 8), ("km", "tk", True, 1, 32, 64, 4, 8),
    ("rm", "tx", True, 2, 64, 128, 8, 8),
]


@pytest.mark.parametrize(("layout", "tile", "packing", "stages", "ms", "ns", "mt", "nt"),
                         STREAM_K)
def test_stream_k_matches_reference(layout, tile, packing, stages, ms, ns, mt, nt, gpu_cases):
    """The stream-K grid: fewer tiles than blocks (K split over many blocks a tile, some
    with one stage), whole-tile waves followed by shared stages, the M edges; the same
    result bit for bit on a second run (the partial sums meet in a fixed order)."""
    config = nmgen.KernelConfig(8, 32, 32, ms, ns, 64, mt, nt, packing=packing,
                                stages=stages, stream_k=True, a_layout=layout, a_tile=tile)
    kernel = nmgen.Kernel(config)
    check_shapes(kernel, [*EDGES, (300, 4096 + 13, 131), (2048 + 7, 1000, 4096 + 3)],
                 gpu_cases)
    rng = np.random.default_rng(SEED)
    b = nmgen.prune(rng.standard_normal((3000, 1000), dtype=np.float32), (8, 32), 32)
    a = make_a(rng, 777, 3000, config.a_layout)
    first, second = kernel(a, b), kernel(a, b)
    assert bool((first == second).all()), f"{config.name}: two runs differ"
    assert relative_error(first, nmgen.reference(a, b)) < RTOL
    gpu_cases["kernel_cases"] += 1


TMA = [  # (A layout, A tile, split_k, stages, MS, NS, KS, MT, NT)
    ("km", "tk", 1, 3, 128, 256, 64, 16, 8), ("km", "tk", 3, 2, 64, 128, 64, 8, 8),
    ("rm", "tx", 1, 2, 64, 128, 64, 8, 8), ("rm", "tx", 2, 3, 128, 128, 32, 8, 8),
]


@pytest.mark.parametrize(("layout", "tile", "split_k", "stages", "ms", "ns", "ks", "mt", "nt"),
                         TMA)
def test_tma_matches_reference(layout, tile, split_k, stages, ms, ns, ks, mt, nt, gpu_cases):
    """Copies by the bulk copy engine (sm_90): the M edges (M = 1, 3, 17, 255: K-major A
    the engine cannot address runs the cp.async twin), odd K and N (the engine's zero fill
    past the edges), a long K; one weight with two A in turn (A's tensor map encoded
    again)."""
    import cupy as cp

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the bulk copy engine is sm_90's")
    config = nmgen.KernelConfig(8, 32, 32, ms, ns, ks, mt, nt, split_k=split_k,
                                stages=stages, tma=True, a_layout=layout, a_tile=tile)
    kernel = nmgen.Kernel(config)
    check_shapes(kernel, [*EDGES, (1024, 4096 + 13, 131)], gpu_cases)
    # K-major A of M % 4 != 0 has rows the engine cannot address: the twin ran those.
    assert list(kernel._instead) == ([config.cp_async_twin().name] if layout == "km" else [])
    rng = np.random.default_rng(SEED)
    b = nmgen.prune(rng.standard_normal((1000, 520), dtype=np.float32), (8, 32), 32)
    both = [make_a(rng, 512, 1000, config.a_layout) for _ in range(2)]  # two addresses
    for a in both:
        out = cp.full((512, 520), cp.nan, cp.float32)
        err = relative_error(kernel(a, b, out=out), nmgen.reference(a, b))
        assert err < RTOL, f"{config.name}, a second A: relative error {err:.3g} (seed {SEED})"
        gpu_cases["kernel_cases"] += 1


@pytest.mark.parametrize(("layout", "tile"), [("km", "tk"), ("rm", "tx")])
def test_tma_uint16_table_matches_reference(layout, tile, gpu_cases):
    """The TMA kernel whose index table is uint16 (int32 would leave no room for its
    mbarriers: 12:32, 128x256, KS 128, 2 stages): M edges (K-major A the engine cannot
    address runs the int32 cp.async twin), odd K and N, a long K with several blocks."""
    import cupy as cp

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the bulk copy engine is sm_90's")
    config = nmgen.KernelConfig(12, 32, 32, 128, 256, 128, 16, 8, stages=2, tma=True,
                                a_layout=layout, a_tile=tile)
    assert config.table_bytes == 2
    kernel = nmgen.Kernel(config)
    check_shapes(kernel, [*EDGES, (384, 4096 + 13, 771)], gpu_cases)
    assert list(kernel._instead) == ([config.cp_async_twin().name] if layout == "km" else [])


def test_tma_kernel_whose_twin_keeps_fewer_stages_matches_reference(gpu_cases):
    """L = 1, 32x256, KS 128, 3 stages: the uint16 table fits, the cp.async twin's int32
    one does not, so the twin keeps 2 stages (a random case once raised ConfigError on a
    K-major A of odd M instead of running)."""
    import cupy as cp

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the bulk copy engine is sm_90's")
    kernel = nmgen.Kernel(nmgen.KernelConfig.from_name(
        "nm_spmm_f32_n16m64l1_ms32ns256ks128_mt4nt4_w2x16_nopack_s3_k1_km_tma_sm90"))
    check_shapes(kernel, [*EDGES, (64, 1000, 300)], gpu_cases)
    twins = list(kernel._instead.values())  # the kernels run in this one's place
    assert len(twins) == 1 and not twins[0].config.tma and twins[0].config.stages == 2


def test_copied_a_from_torch_on_a_side_stream(gpu_cases):
    torch = pytest.importorskip("torch")
    config = nmgen.KernelConfig(4, 8, 16, 64, 64, 32, 4, 4, a_tile="tx")
    b = nmgen.prune(torch.randn(96, 77), "4:8", 16, layout="nk")
    x = torch.randn(33, 77, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = nmgen.Kernel(config)(x, b)
    stream.synchronize()
    ref = nmgen.reference(x.cpu().double().numpy(), b)
    err = np.linalg.norm(y.cpu().double().numpy() - ref) / np.linalg.norm(ref)
    assert err < RTOL
    gpu_cases["kernel_cases"] += 1


def test_torch_in_torch_out_on_current_stream(gpu_cases):
    torch = pytest.importorskip("torch")
    config = nmgen.KernelConfig(4, 8, 16, 64, 64, 32, 4, 4)
    weight = torch.randn(96, 77)  # nn.Linear(77, 96).weight: [out, in]
    b = nmgen.prune(weight, "4:8", 16, layout="nk")
    x = torch.randn(33, 77, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = nmgen.Kernel(config)(x, b)
    stream.synchronize()
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.shape == (33, 96)
    ref = nmgen.reference(x.cpu().double().numpy(), b)
    err = np.linalg.norm(y.cpu().double().numpy() - ref) / np.linalg.norm(ref)
    assert err < RTOL
    gpu_cases["kernel_cases"] += 1


def test_torch_launch_stream_is_the_current_one():
    torch = pytest.importorskip("torch")
    from nmgen.runtime.device import launch_stream, operand

    x = torch.randn(4, 4, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        chosen = launch_stream(None, operand(x, "a"))
        assert chosen.ptr == side.cuda_stream != torch.cuda.default_stream().cuda_stream
    assert launch_stream(None, operand(x, "a")).ptr == torch.cuda.current_stream().cuda_stream


def test_bad_inputs_raise_clear_errors():
    import cupy as cp

    config = nmgen.KernelConfig(2, 4, 8, 32, 32, 16, 4, 4)
    kernel = nmgen.Kernel(config)
    b = nmgen.prune(np.random.default_rng().standard_normal((64, 40)), "2:4", 8)
    a = cp.random.standard_normal((10, 64), dtype=cp.float32)
    with pytest.raises(TypeError, match="a is float64: .* takes f32 activations"):
        kernel(a.astype(cp.float64), b)
    with pytest.raises(TypeError, match="NumPy"):
        kernel(a.get(), b)
    with pytest.raises(ValueError, match="K must equal"):
        kernel(a[:, :60], b)
    with pytest.raises(ValueError, match="row-major"):
        kernel(cp.asfortranarray(a), b)
    with pytest.raises(ValueError, match="out has shape"):
        kernel(a, b, out=cp.empty((10, 41), cp.float32))
    with pytest.raises(TypeError, match="out has the wrong dtype"):
        kernel(a, b, out=cp.empty((10, 40), cp.float64))
    with pytest.raises(ValueError, match="is for 2:4"):
        kernel(a, nmgen.prune(np.ones((64, 40)), "1:4", 8))
    with pytest.raises(TypeError, match="NMMatrix"):
        kernel(a, np.ones((64, 40), np.float32))
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="CPU tensor"):
        kernel(torch.ones(10, 64), b)


def test_checks_remembered_after_a_good_call_still_catch_bad_calls():
    import cupy as cp

    kernel = nmgen.Kernel(nmgen.KernelConfig(2, 4, 8, 32, 32, 16, 4, 4))
    b = nmgen.prune(np.random.default_rng().standard_normal((64, 40)), "2:4", 8)
    a = cp.random.standard_normal((10, 64), dtype=cp.float32)
    out = cp.empty((10, 40), cp.float32)
    kernel(a, b, out=out)  # shape, strides and dtypes of a and out now remembered
    raw = cp.empty(10 * 64 + 1, cp.float32)
    misaligned = cp.ndarray((10, 64), cp.float32, raw.data + 2, strides=a.strides)
    assert misaligned.data.ptr % 4
    with pytest.raises(ValueError, match="4-byte aligned"):  # same shape and strides
        kernel(misaligned, b)
    with pytest.raises(ValueError, match="is for 2:4"):  # same K, another pattern
        kernel(a, nmgen.prune(np.ones((64, 40)), "1:4", 8))
    with pytest.raises(ValueError, match="out has shape"):
        kernel(a, b, out=cp.empty((10, 41), cp.float32))
    if cp.cuda.runtime.getDeviceCount() > 1:
        with cp.cuda.Device(1), pytest.raises(ValueError, match="current device"):
            kernel(a, b, out=out)
