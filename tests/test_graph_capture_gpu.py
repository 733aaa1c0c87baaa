"""GPU: launches captured into CUDA graphs (CuPy's and PyTorch's) and replayed.

Inference code captures its layers once and replays them. A captured launch must replay
the same work on the buffers it was captured with, new values in them included, and its
internal workspaces (row-major A's K-major copy, split-K partial sums, stream-K slots)
must stay reserved for the graph: memory allocated after the capture must never be
written by a replay.
"""

from __future__ import annotations

import numpy as np
import pytest

import nmgen
from nmgen.families.f32_simt.copy_plan import copy_chunk_rows
from nmgen.runtime.device import device_info, operand

from .gpu_suite import SEED

pytestmark = pytest.mark.gpu

RTOL = 1e-5
SENTINEL = 12345.0

# name -> (configuration, M, K, N): every path that takes a workspace, and one that does not
CASES = {
    "plain": (nmgen.KernelConfig(8, 32, 32, 64, 128, 32, 8, 8, a_layout="km", a_tile="tk"),
              255, 333, 257),
    "copied A": (nmgen.KernelConfig(8, 32, 32, 64, 128, 32, 8, 8, a_tile="tx"), 1000, 333, 257),
    "split-K": (nmgen.KernelConfig(8, 32, 32, 64, 128, 32, 8, 8, split_k=3, a_layout="km",
                                   a_tile="tk"), 300, 1024 + 13, 131),
    "stream-K": (nmgen.KernelConfig(8, 32, 32, 64, 128, 64, 8, 8, stream_k=True,
                                    a_layout="km", a_tile="tk"), 300, 4096 + 13, 131),
    "copied A, pipelined": (nmgen.KernelConfig(8, 32, 32, 128, 256, 64, 16, 8, stages=3,
                                               a_tile="tx"), None, 4096 + 13, 4096 + 13),
}


def launch_of(plan, entry: str):
    """The launch of ``entry`` in a family's launch plan (``None``: the plan has none)."""
    return next((launch for launch in plan.launches if launch.entry == entry), None)


def copy_ld(plan, name: str) -> int | None:
    """Floats between the K rows of the K-major copy of A that the plan's transpose
    writes (its last argument); ``None`` where the plan copies no A."""
    copy = launch_of(plan, name + "_transpose")
    return None if copy is None else copy.args[-1].value


def chunk_rows(kernel: nmgen.Kernel, b, a_op, lda: int) -> int:
    """The rows of the chunks a pipelined call cuts M in on this GPU (0: none pays): the
    family's rule on the main launch's block columns and the blocks of it the GPU holds
    at once, read from the plan of M = 4 (they do not depend on M)."""
    c = kernel.config
    main = launch_of(kernel._bound(b, a_op, 4, lda).plan, c.name)
    per_sm = kernel._resident_blocks(a_op.device)(main.entry, main.threads, main.smem)
    return int(copy_chunk_rows(b.shape[0], c.ms, main.grid[0], device_info().sms * per_sm))


def operands(name: str, rng: np.random.Generator):
    """(kernel, b, a as CuPy in the kernel's layout, M): for the pipelined case M is three
    and a half chunks on this GPU (asserted, else the case would not pipeline)."""
    import cupy as cp

    config, m_rows, k_dim, n_cols = CASES[name]
    kernel = nmgen.Kernel(config)
    b = nmgen.prune(rng.standard_normal((k_dim, n_cols), dtype=np.float32),
                    (config.n, config.m), config.vec)
    if m_rows is None:
        probe = operand(cp.empty(4, cp.float32), "a")  # the plan needs only the device
        rows = chunk_rows(kernel, b, probe, k_dim)
        m_rows = 3 * rows + rows // 2 + 37
        assert len(kernel._bound(b, probe, m_rows, k_dim).plan.chunks) == 4
    a = cp.asarray(rng.standard_normal((m_rows, k_dim), dtype=np.float32))
    if config.a_layout is nmgen.ALayout.K_MAJOR:
        a = cp.ascontiguousarray(a.T).T
    return kernel, b, a, m_rows


def workspace_bytes(kernel: nmgen.Kernel, b, a) -> list[int]:
    """Bytes of each workspace a launch takes (the sizes the pool would hand out again)."""
    a_op = operand(a, "a")
    m_rows, lda = kernel._check_a(a_op, b)
    plan = kernel._bound(b, a_op, m_rows, lda).plan
    depth, n_cols = b.shape
    c = kernel.config
    ld = copy_ld(plan, c.name)
    sizes = []
    if ld is not None and len(plan.chunks) > 1:
        lds = [copy_ld(kernel._bound(b, a_op, rows, lda).plan, c.name) for rows in plan.chunks]
        sizes += [4 * depth * max(lds)] * 2
    elif ld is not None:
        sizes.append(4 * depth * ld)
    if c.stream_k:  # a partial-sum tile and a flag a block of the persistent grid
        blocks = launch_of(plan, c.name).grid[0]
        sizes += [4 * blocks * c.ms * c.ns, 4 * blocks]
    elif c.split_k > 1:
        sizes.append(4 * c.split_k * m_rows * n_cols)
    return sizes


def sentinels(sizes: list[int], torch=None) -> list:
    """Two arrays of every size, filled with SENTINEL: allocated after a capture, they
    take any workspace memory that went back to the pool (CuPy's, or torch's)."""
    import cupy as cp

    arrays = [cp.full(size // 4, SENTINEL, cp.float32) for size in sizes for _ in range(2)]
    if torch is not None:
        arrays += [torch.full((size // 4,), SENTINEL, device="cuda")
                   for size in sizes for _ in range(2)]
    return arrays


def fill_new_values(a, rng: np.random.Generator) -> None:
    """New values into ``a`` in place (the graph keeps its address)."""
    import cupy as cp

    a[...] = cp.asarray(rng.standard_normal(a.shape, dtype=np.float32))


def check(out, a, b) -> None:
    import cupy as cp

    out64 = cp.asarray(out, dtype=cp.float64)
    ref = nmgen.reference(cp.asarray(a), b)
    assert not bool(cp.isnan(out64).any()), "the replay left output unwritten"
    err = float(cp.linalg.norm(out64 - ref) / max(float(cp.linalg.norm(ref)), 1e-30))
    assert err < RTOL, f"relative error {err:.3g} (seed {SEED})"


@pytest.mark.parametrize("name", list(CASES))
def test_cupy_graph_replays_the_launch(name, gpu_cases):
    import cupy as cp

    rng = np.random.default_rng(SEED)
    kernel, b, a, m_rows = operands(name, rng)
    if kernel.config.tma and cp.cuda.Device().compute_capability != "90":
        pytest.skip("the bulk copy engine is sm_90's")
    out = cp.full((m_rows, b.shape[1]), cp.nan, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        kernel(a, b, out=out)  # warm: compile, plan, prepare the weight
        stream.synchronize()
        stream.begin_capture()
        kernel(a, b, out=out)
        graph = stream.end_capture()
        a_op = operand(a, "a")
        bound = kernel._bound(b, a_op, *kernel._check_a(a_op, b))
        assert len(bound.kept) == len(workspace_bytes(kernel, b, a))  # kept for the graph
        others = sentinels(workspace_bytes(kernel, b, a))  # a replay must leave them be
        for _ in range(2):
            fill_new_values(a, rng)
            out.fill(cp.nan)
            graph.launch(stream)
            stream.synchronize()
            check(out, a, b)
            for other in others:
                assert bool((other == SENTINEL).all()), "a replay wrote into freed memory"
    gpu_cases["kernel_cases"] += 2


@pytest.mark.parametrize("name", list(CASES))
def test_torch_graph_replays_the_launch(name, gpu_cases):
    torch = pytest.importorskip("torch")
    import cupy as cp

    rng = np.random.default_rng(SEED)
    kernel, b, a, _ = operands(name, rng)
    if kernel.config.tma and cp.cuda.Device().compute_capability != "90":
        pytest.skip("the bulk copy engine is sm_90's")
    x = torch.as_tensor(a, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on a side stream, as torch asks
        kernel(x, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = kernel(x, b)
    a_op = operand(x, "a")
    bound = kernel._bound(b, a_op, *kernel._check_a(a_op, b))
    assert bound.kept == []  # workspaces are temporaries of the graph's own pool
    others = sentinels(workspace_bytes(kernel, b, a), torch)  # outside it: left be
    for _ in range(2):
        fill_new_values(cp.asarray(x), rng)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(y, x, b)
        for other in others:
            assert bool((other == SENTINEL).all()), "a replay wrote into freed memory"
    gpu_cases["kernel_cases"] += 2


def test_first_call_inside_capture_is_refused_clearly():
    """The first call for a weight and M builds its launch (compile, weight layout), which
    cannot be captured: a clear error, and the capture is still usable after it."""
    import cupy as cp

    rng = np.random.default_rng(SEED)
    kernel, b, a, m_rows = operands("copied A", rng)
    out = cp.empty((m_rows, b.shape[1]), cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        with pytest.raises(RuntimeError, match="once before capturing"):
            kernel(a, b, out=out)
        stream.end_capture()
        kernel(a, b, out=out)  # outside capture: builds the launch and runs
        stream.synchronize()
    check(out, a, b)


@pytest.mark.parametrize("capture_stream", ["warm-up stream", "torch's own"])
def test_torch_graph_keeps_the_split_k_counters_of_its_stream(capture_stream, monkeypatch,
                                                              gpu_cases):
    """A decode kernel's split-K tile counters: a graph captured on the stream that warmed
    up (as torch's graph trees do) uses that stream's counters, which the kernels leave
    zeroed, and zero-fills none of its own; a graph captured elsewhere zero-fills a
    temporary at every replay. Both replay correctly, calls on the stream in between."""
    torch = pytest.importorskip("torch")
    import cupy as cp

    from nmgen.families.gemv.config import GemvConfig
    from nmgen.runtime import launch

    rng = np.random.default_rng(SEED)
    config = GemvConfig(4, 16, 32, rows=1, col_threads=128, lanes=1, cols=4, unroll=4,
                        split_k=4)
    kernel = nmgen.Kernel(config)
    b = nmgen.prune(rng.standard_normal((4096 + 13, 333), dtype=np.float32), (4, 16), 32)
    x = torch.as_tensor(rng.standard_normal((3, b.shape[0]), dtype=np.float32), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kernel(x, b)  # warm up: the launch is built, the side stream's counters made
    torch.cuda.current_stream().wait_stream(side)
    zero_filled = []
    made = launch._torch_workspace
    monkeypatch.setattr(launch, "_torch_workspace", lambda a_op, count, dtype, zeroed: (
        zero_filled.append(zeroed), made(a_op, count, dtype, zeroed))[1])
    warm = capture_stream == "warm-up stream"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side if warm else None):
        y = kernel(x, b)
    assert zero_filled == ([False] if warm else [False, True])  # the partial sums, counters
    for _ in range(3):
        fill_new_values(cp.asarray(x), rng)
        y.fill_(float("nan"))
        graph.replay()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            between = kernel(x, b)  # the stream's own call, after the replay
        torch.cuda.synchronize()
        check(y, x, b)
        check(between, x, b)
        gpu_cases["kernel_cases"] += 2
