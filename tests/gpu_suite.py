"""The GPU suite's plumbing: one seed a run, every kernel its tests compile known ahead and
compiled in parallel processes while the tests run, each kernel compiled once on the host.

Almost all of a fresh machine's GPU test time is NVRTC. ``conftest.py`` therefore starts,
as the session begins, ``python -m tests.gpu_suite precompile``: it lists the kernels the
GPU tests will compile (``suite_kernels``: the named configurations of the tests, the
random ones drawn from this run's seed, the model's and dispatch's choices, the fuzz's
configurations) and compiles them, in the order the tests want them, in a pool of niced
processes into CuPy's on-disk cache (no CUDA context of their own:
``nmgen.compiler.nvrtc.cache_only``), while pytest-xdist's workers start and run tests. In
a test process every kernel compile takes the kernel's host lock (``compile_under_lock``):
a kernel the pool is compiling is waited for and then loaded from the cache, one it has not
reached yet is compiled by the test (the pool, finding it locked or cached, moves on). No
kernel is compiled twice; a kernel the list misses is compiled by its test, as before.

``SEED``: every random draw of the GPU tests starts from ``NMGEN_TEST_SEED``, which
conftest sets fresh every run before the workers and the compile process start (so all of
them draw the same configurations); set it to replay a run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def run_seed() -> int:
    """This run's seed: ``NMGEN_TEST_SEED``, else a fresh one, set there for the processes
    this one starts (the first import is the conftest's, before pytest-xdist starts its
    workers)."""
    value = os.environ.get("NMGEN_TEST_SEED")
    if not value:
        value = os.environ["NMGEN_TEST_SEED"] = str(int.from_bytes(os.urandom(4), "little"))
    return int(value)


SEED = run_seed()

# The fuzz (``nmgen selftest``, tests/test_selftest_gpu.py): cases a family, cases a
# compiled configuration (its shapes, M from 1, odd N and K, wide rows of A), and how many
# tests share a family's configurations (pytest-xdist runs them side by side).
FUZZ_CASES = int(os.environ.get("NMGEN_FUZZ_CASES", "10000"))
FUZZ_PER_CONFIG = int(os.environ.get("NMGEN_FUZZ_PER_CONFIG", "400"))
FUZZ_SHARDS = int(os.environ.get("NMGEN_FUZZ_SHARDS", "4"))
FUZZ_MAX_SIZE = 384

# Tests that compile what no list can know ahead (tuning, benchmarks in processes of their
# own, torch.compile): run first, beside the compile processes. Node id prefixes.
FIRST = (
    "tests/test_tune_dispatch_gpu.py::",
    "tests/test_bench_gpu.py::test_small_bench_run",
    "tests/test_bench_gpu.py::test_bench_k_major_a",
    "tests/test_bench_gpu.py::test_bf16_untuned_bench_run",
    "tests/test_bench_gpu.py::test_decode_bench_rows_are_checked_and_complete",
    "tests/test_bench_gpu.py::test_bf16_bench_of_prefill_sizes_takes_both_layouts",
    "tests/test_carry.py::test_carry_remeasure_on_the_gpu",
    "tests/test_family_plugin.py::test_family_kernel_runs_through_dispatch",
    "tests/test_transfer.py::test_dispatch_quick_tunes_on_first_use",
    "tests/test_nn_gpu.py::test_fullgraph_compile_matches_eager",
    "tests/test_nn_gpu.py::test_reduce_overhead_replays_match_eager",
)
FUZZ = "tests/test_selftest_gpu.py::test_random_cases_of_every_family"
# Tests that compile many kernels each (in ``compile_ahead``): before the others.
HEAVY = (
    "tests/test_epilogue_gpu.py::test_every_epilogue_of_every_family_matches_float64",
    "tests/test_mma_gpu.py::test_random_configurations_and_shapes_match_float64",
    "tests/test_wgmma_gpu.py::test_random_configurations_and_shapes_match_float64",
    "tests/test_gemv_gpu.py::test_prefetch_and_wide_sum_match_float64_and_the_kernel_without",
)

HEAVY_GROUPS = ("epilogue variants", "mma random", "wgmma random", "gemv pairs")


def order_of(nodeid: str, alone: bool) -> int:
    """Where a GPU test runs (longest first, as pytest-xdist hands tests out in order):
    the ones that compile for themselves, the fuzz's shards, the ones of many kernels, the
    rest (the compile process takes their kernels in this order), and last the ones that
    time the GPU alone (``gpu_alone``)."""
    if alone:
        return 4
    for rank, prefixes in enumerate((FIRST, (FUZZ,), HEAVY)):
        if nodeid.startswith(prefixes):
            return rank
    return 3


# ------------------------------------------------------------------ one compile a host
def lock_name(code: str, target: str | None) -> str:
    """The host lock of one kernel's compile (its source and target)."""
    return "src-" + hashlib.sha256(f"{target}\0{code}".encode()).hexdigest()[:32]


@contextlib.contextmanager
def kernel_lock(name: str, blocking: bool = True) -> Iterator[bool]:
    """``name``'s lock among this host's processes (in CuPy's cache folder, beside the
    tuner's); yields whether it is held (``blocking=False``: not where another holds it)."""
    from nmgen.compiler.nvrtc import kernel_cache_dir

    folder = kernel_cache_dir() / "nmgen-locks"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@dataclasses.dataclass
class CompileCount:
    """A test process's kernel compiles: how many ran NVRTC here, their CPU time, and the
    time spent waiting for another process compiling the same kernel."""

    compiled: int = 0
    cpu_s: float = 0.0
    wait_s: float = 0.0

    def snapshot(self) -> dict[str, float]:
        return dataclasses.asdict(self)


COUNT = CompileCount()
COMPILED_CPU_S = 0.1  # less: found in CuPy's cache (nmgen.compiler.pool uses the same)


def compile_under_lock(compile_module: Callable[..., Any]) -> Callable[..., Any]:
    """``nmgen.compiler.nvrtc.compile_module`` compiling at once under the kernel's host
    lock (CuPy's own compile is lazy, at the first ``get_function``); ``blocking=False``:
    ``None`` at once where another process holds the lock."""
    from nmgen.compiler.nvrtc import arch_specific

    def compile_locked(code: str, target: str | None = None, *, blocking: bool = True) -> Any:
        start = time.perf_counter()
        with kernel_lock(lock_name(code, target), blocking) as held:
            if not held:
                return None
            waited, cpu = time.perf_counter() - start, time.process_time()
            module = compile_module(code, target)
            if not arch_specific(target):
                module.compile()
            cpu = time.process_time() - cpu
        COUNT.wait_s += waited
        if cpu >= COMPILED_CPU_S:
            COUNT.compiled += 1
            COUNT.cpu_s += cpu
        return module

    compile_locked.under_lock = True
    return compile_locked


def share_compiles() -> None:
    """In a test process: every kernel compile under its host lock (``compile_under_lock``)."""
    from nmgen.runtime import launch

    if not getattr(launch.compile_module, "under_lock", False):
        launch.compile_module = compile_under_lock(launch.compile_module)


SHARED = "NMGEN_SUITE_PRECOMPILE"  # "1" while the suite's compile process runs


def compile_ahead(configs: list) -> list[str]:
    """Compile ``configs`` before a test runs them; the errors (empty when none). Beside the
    suite's compile process (``SHARED``): here, one by one under the kernels' host locks,
    most of them compiled or under way there already; else in a pool of processes."""
    if os.environ.get(SHARED) != "1":
        from nmgen.compiler.pool import precompile as in_a_pool

        return in_a_pool(configs, workers=min(16, os.cpu_count() or 1))
    from nmgen.codegen import render
    from nmgen.runtime import launch

    share_compiles()
    errors, busy = [], []
    for blocking, todo in ((False, configs), (True, busy)):  # the free ones, then the rest
        for config in todo:
            try:
                source = render(config)
                if launch.compile_module(source.code, source.target, blocking=blocking) is None:
                    busy.append(config)  # the compile process has it under way
            except Exception as exc:  # reported as the pool reports it
                errors.append(f"{config.name}: {exc}")
    return errors


# ------------------------------------------------------------------ the kernels
def with_twins(configs: list) -> list:
    """``configs`` and, after each FP32 bulk-copy kernel reading A itself, the cp.async
    twin it runs on an A the copy engine cannot address."""
    out = []
    for config in configs:
        out.append(config)
        if config.family == "f32" and config.tma and not config.a_copied:
            out.append(config.cp_async_twin())
    return out


def fuzz_kernels(info: Any) -> dict[str, list]:
    """Each family's fuzz configurations (``selftest.family_configs``), as the shards take
    them."""
    from nmgen.bench.selftest import family_configs, fuzz_arch
    from nmgen.families.registry import all_families
    from nmgen.gpus import spec_or_h100, table_name

    gpu = spec_or_h100(table_name(info.name))
    archs = {f.name: fuzz_arch(f, info.arch) for f in all_families()}
    return {f.name: family_configs(f, SEED, FUZZ_CASES, FUZZ_PER_CONFIG, archs[f.name], gpu)
            for f in all_families() if archs[f.name] is not None}


def kernel_listings(info: Any) -> list[tuple[str, Callable[[], list]]]:
    """The kernels of the GPU tests other than the fuzz, by test module, in their order:
    each entry a module and a function listing its kernels (run in the compile process)."""
    from nmgen.dispatch import Dispatcher
    from nmgen.epilogue import Activation, Epilogue
    from nmgen.format import DType
    from nmgen.gpus import Arch, spec_or_h100, table_name
    from nmgen.problem import ALayout, Problem

    gpu = spec_or_h100(table_name(info.name))
    sm90 = info.arch is Arch.SM90
    empty = Dispatcher([], device=info)

    def decided(dispatcher, problem, shape, epilogue=None):
        return dispatcher.decide(problem, shape, epilogue or Epilogue()).config

    def kernels():
        from nmgen import KernelConfig

        from . import test_kernels_gpu as t

        out = [t.random_config(case)[0] for case in range(t.CONFIGS)]
        out += [KernelConfig(8, 32, 32, 128, 128, 64, 8, 8, packing=p, a_layout=layout)
                for layout in ALayout for p in (False, True)]
        out.append(KernelConfig(8, 32, 32, 64, 128, 64, 8, 8))
        out += [KernelConfig(8, 32, 32, 64, 128, 64, 8, 8, packing=p, split_k=s,
                             a_tile="tx") for s, p in ((1, False), (3, True))]
        out += [KernelConfig(8, 32, 32, **shape, a_tile="tx") for shape in t.PIPELINED]
        if not sm90:
            out.append(KernelConfig(8, 32, 32, **t.PIPELINED[0], a_tile="tx")
                       .replace(tma=False))
        out += [KernelConfig(8, 32, 32, 32, 64, 128, 4, 4, warp_m=4, warp_n=8, packing=p,
                             split_k=k, stages=s, slice_k=sk, a_layout=layout, a_tile=tile)
                for sk, layout, tile, p, k, s in t.SLICED]
        out += [KernelConfig(8, 32, 32, ms, ns, 64, mt, nt, packing=p, stages=s,
                             stream_k=True, a_layout=layout, a_tile=tile)
                for layout, tile, p, s, ms, ns, mt, nt in t.STREAM_K]
        if sm90:
            out += [KernelConfig(8, 32, 32, ms, ns, ks, mt, nt, split_k=k, stages=s,
                                 tma=True, a_layout=layout, a_tile=tile)
                    for layout, tile, k, s, ms, ns, ks, mt, nt in t.TMA]
            out += [KernelConfig(12, 32, 32, 128, 256, 128, 16, 8, stages=2, tma=True,
                                 a_layout=layout, a_tile=tile)
                    for layout, tile in (("km", "tk"), ("rm", "tx"))]
            out.append(KernelConfig.from_name(
                "nm_spmm_f32_n16m64l1_ms32ns256ks128_mt4nt4_w2x16_nopack_s3_k1_km_tma_sm90"))
        out += [KernelConfig(4, 8, 16, 64, 64, 32, 4, 4, a_tile="tx"),
                KernelConfig(4, 8, 16, 64, 64, 32, 4, 4), KernelConfig(2, 4, 8, 32, 32, 16, 4, 4)]
        return out

    def mma():
        from nmgen.families.mma import MMA
        from nmgen.families.mma.config import MmaConfig

        from . import test_mma_gpu as t

        out = [MmaConfig.from_name(name) for name in t.GROUPED]
        shape = (4096, 4096, 4096)
        out += [MMA.default_config(Problem(p.n, p.m, p.vec, p.a_layout, info.arch, p.dtype),
                                   gpu, shape) for p in t.LARGE]
        out.append(decided(empty, Problem(8, 32, 128, ALayout.ROW_MAJOR, info.arch, "bf16"),
                           (1000, 4096, 1000)))
        return out

    def wgmma():
        if not sm90:
            return []
        from nmgen.families.wgmma import WGMMA
        from nmgen.families.wgmma.config import WgmmaConfig

        from . import test_wgmma_gpu as t

        out = [WgmmaConfig.from_name(name) for name in t.TILES + t.WARP + t.TMA]
        out += [WGMMA.default_config(p, gpu, (4096, 4096, 4096)) for p in t.LARGE]
        out.append(decided(empty, Problem(8, 32, 128, ALayout.K_MAJOR, info.arch, "bf16"),
                           (2048, 4096, 4096)))
        return out

    def sptc():
        if not sm90:
            return []
        from nmgen.families.sptc.config import SptcConfig

        from . import test_sptc_gpu as t

        out = [SptcConfig.from_name(name) for name in (*t.CONFIGS, t.PREFILL_TILE)]
        out += [decided(empty, Problem(2, 4, 1, ALayout.ROW_MAJOR, info.arch, "bf16"),
                        (rows, 3584, 2048)) for rows in t.DISPATCH_ROWS]
        return out

    def mmasp():
        from nmgen.families.mmasp.config import MmaSpConfig

        from . import test_mmasp_gpu as t

        return [MmaSpConfig.from_name(name) for name in (*t.CONFIGS, t.PREFILL_TILE)]

    def mma_random():
        from . import test_mma_gpu as t

        return t.draw_configs(random.Random(SEED), t.CONFIGS)

    def wgmma_random():
        if not sm90:
            return []
        from . import test_wgmma_gpu as t

        return t.draw_configs(random.Random(SEED), t.CONFIGS)

    def epilogue_variants():
        from . import test_epilogue_gpu as t

        return [v for configs in (t.F32, t.GEMV, t.MMA, t.WGMMA)
                for v in t.variants([c for c in configs if sm90 or not (
                    getattr(c, "tma", False) or c.family == "wgmma")])]

    def epilogue():
        from nmgen import KernelConfig

        from . import test_epilogue_gpu as t
        from .test_kernels_gpu import PIPELINED

        out = []
        out.append(KernelConfig(8, 32, 32, **PIPELINED[1], a_tile="tx", epilogue="bias_gelu"))
        for rows, dtype in t.DISPATCHED:
            out.append(decided(empty, Problem(8, 32, 128, ALayout.ROW_MAJOR, info.arch, dtype),
                               (rows, 520, 1000), Epilogue(True, Activation.SILU)))
        plain = KernelConfig(2, 4, 8, 32, 32, 16, 4, 4)
        return [*out, plain, plain.replace(epilogue="bias_relu")]

    def gemv():
        from . import test_gemv_gpu as t

        return [c for pair in t.PAIRS for c in pair]

    def graphs():
        from nmgen.families.gemv.config import GemvConfig

        from . import test_graph_capture_gpu as t

        return [config for config, *_ in t.CASES.values()] + [GemvConfig(
            4, 16, 32, rows=1, col_threads=128, lanes=1, cols=4, unroll=4, split_k=4)]

    def nn():
        from . import test_nn_gpu as t

        shipped = Dispatcher(device=info)  # nmgen.nn's: the user's and the shipped records
        n, m = (int(x) for x in t.PATTERN.split(":"))
        out = []
        layers = [(dtype, t.N, t.K, Epilogue(bias, act))
                  for dtype in (DType.F32, DType.BF16, DType.F16)
                  for act in t.ACTIVATIONS for bias in (True, False)]
        layers += [(dtype, cols, depth, epilogue)
                   for dtype in (DType.F32, DType.BF16)
                   for cols, depth, epilogue in ((t.HIDDEN, t.K, Epilogue(True, "gelu")),
                                                 (t.N, t.HIDDEN, Epilogue()))]
        for dtype, cols, depth, epilogue in layers:
            for rows in t.SHAPES:
                problem = Problem(n, m, t.VEC, ALayout.ROW_MAJOR, info.arch, dtype)
                out.append(decided(shipped, problem, (rows, cols, depth), epilogue))
        return out

    def others():
        from . import test_carry as carry

        return [carry.UNSPLIT, carry.SPLIT, carry.CORE_8_32_KM,
                decided(empty, Problem(2, 8, 8, ALayout.ROW_MAJOR, info.arch, "f32"),
                        (9, 70, 90))]

    return [(HEAVY_GROUPS[0], epilogue_variants), (HEAVY_GROUPS[1], mma_random),
            (HEAVY_GROUPS[2], wgmma_random), (HEAVY_GROUPS[3], gemv),  # HEAVY's order
            ("test_epilogue_gpu", epilogue), ("test_graph_capture_gpu", graphs),
            ("test_kernels_gpu", kernels), ("test_mma_gpu", mma), ("test_nn_gpu", nn),
            ("test_wgmma_gpu", wgmma), ("test_sptc_gpu", sptc), ("test_mmasp_gpu", mmasp),
            ("others", others)]


def kernel_groups(info: Any, log: Callable[[str], None] = print
                  ) -> Iterator[tuple[str, list]]:
    """The kernels the GPU tests compile that can be known ahead, by group, in the order
    the compile process takes them: the tests' (in their order), then the fuzz's (the
    shards' in turn; until the process reaches them, each shard compiles its own, one
    after another)."""
    for module, listing in kernel_listings(info):
        try:
            yield module, with_twins(listing())
        except Exception as exc:  # a list that fails costs time, never a test
            log(f"{module}: kernels not listed ({type(exc).__name__}: {exc})")
    yield "fuzz", fuzz_order(info)


def fuzz_order(info: Any) -> list:
    """The fuzz's kernels, the shards' in turn."""
    fuzz = fuzz_kernels(info)
    turns = [configs[i::FUZZ_SHARDS] for configs in fuzz.values() for i in range(FUZZ_SHARDS)]
    return [c for row in _round_robin(turns) for c in row]


# The groups that ask dispatch and the model: on a fresh machine their tables take seconds
# to build (then kept on disk, for the tests to load); listed in compile processes at once.
SLOW_GROUPS = ("test_epilogue_gpu", "test_mma_gpu", "test_nn_gpu", "test_wgmma_gpu",
               "test_sptc_gpu", "others")


def _list_group(info: Any, name: str) -> list[str]:
    """Compile process: group ``name``'s kernels, as JSON."""
    return [c.to_json() for c in with_twins(dict(kernel_listings(info))[name]())]


def suite_kernels(info: Any, log: Callable[[str], None] = print) -> list:
    """Every kernel of ``kernel_groups``, once, in its order."""
    return list({c.name: c for _, group in kernel_groups(info, log) for c in group}.values())


def _round_robin(lists: list[list]) -> Iterator[list]:
    """The first of each list, then the second of each, ..."""
    for i in range(max((len(x) for x in lists), default=0)):
        yield [x[i] for x in lists if i < len(x)]


# ------------------------------------------------------------------ the compile process
def _compile_unless_busy(arch: str | None, config_json: str) -> tuple[str, float]:
    """Compile process: one kernel into CuPy's cache, unless a test process holds its lock
    (it is compiling it). (what happened, CPU seconds): "compiled", "cached", "busy" or
    the error."""
    from nmgen.codegen import render
    from nmgen.compiler.nvrtc import arch_specific, build_cubin, cache_only, compile_module
    from nmgen.families.registry import config_from_dict

    if arch is not None:
        cache_only(arch)
    cpu = time.process_time()
    try:
        source = render(config_from_dict(json.loads(config_json)))
        with kernel_lock(lock_name(source.code, source.target), blocking=False) as held:
            if not held:
                return "busy", time.process_time() - cpu
            if arch_specific(source.target):
                build_cubin(source.code, source.target)
            else:
                compile_module(source.code).compile()
    except Exception as exc:  # reported: the test of the kernel fails on it itself
        return f"{type(exc).__name__}: {exc}", time.process_time() - cpu
    used = time.process_time() - cpu
    return ("compiled" if used >= COMPILED_CPU_S else "cached"), used


def warm_cupy(configs: list, log: Callable[[str], None]) -> None:
    """CuPy's own kernels (fills, casts, norms, products in float64) compile at their first
    use in every process; run the tests' checking code once here on small cases of
    ``configs`` (kernels the tests want first, one a family), so that the test processes
    find them in CuPy's cache."""
    import cupy as cp
    import numpy as np

    from nmgen.bench.selftest import Case, run_case
    from nmgen.format import reference
    from nmgen.runtime.launch import Kernel

    for config in configs:
        try:
            kernel = Kernel(config)
            for rows in (1, 37):
                run_case(kernel, Case(config.name, rows, 70, 90, 3, 1))
        except Exception as exc:  # only a cold start for the tests
            log(f"warm-up {config.name}: {type(exc).__name__}: {exc}")
    try:
        import nmgen

        a = cp.asarray(np.random.default_rng(0).standard_normal((7, 64), dtype=np.float32))
        b = nmgen.prune(np.ones((64, 40), np.float32), "2:4", 8)
        ref = reference(a, b)
        out = cp.full((7, 40), cp.nan, cp.float32)
        float(cp.linalg.norm(cp.asarray(out, dtype=cp.float64) - ref))
        bool(cp.isnan(out).any()), bool((out == out).all())
    except Exception as exc:
        log(f"warm-up reference: {type(exc).__name__}: {exc}")


def precompile(workers: int, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Compile the kernels of ``kernel_groups`` in ``workers`` niced processes (the groups
    that ask dispatch listed there too) while CuPy's kernels warm up here; what happened
    (written to ``out`` as JSON, also when stopped by SIGTERM: the numbers so far)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from nmgen.compiler.nvrtc import compile_arch, start_compile_process, warm
    from nmgen.compiler.pool import AHEAD_NICE
    from nmgen.families.base import epilogue_of
    from nmgen.families.registry import config_from_dict
    from nmgen.runtime.device import device_info

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(1)

    signal.signal(signal.SIGTERM, stop)  # pytest's end, with kernels still queued
    start = time.perf_counter()
    futures: dict[str, Any] = {}
    futures_configs: list = []
    groups: dict[str, int] = {}
    done_at: dict[str, float] = {}  # a group's last compile's end, from the start
    phases: dict[str, float] = {}
    pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"),
                               initializer=start_compile_process, initargs=(AHEAD_NICE,))
    # The slow groups are listed at the tests' priority, not the compiles': listed in the
    # niced compile processes they finished 75-115 s into the suite on fresh H200s (wall
    # 120-163 s), their kernels queued only then.
    lister = ProcessPoolExecutor(len(SLOW_GROUPS), mp_context=get_context("spawn"))
    try:
        for _ in range(workers):  # processes start (CuPy, NVRTC) while the list is made
            pool.submit(warm)
        info = device_info()
        arch = compile_arch()
        share_compiles()  # this process's own compiles (the warm-up's) share the lock too

        def queue(name: str, configs: list) -> None:
            new = [c for c in {c.name: c for c in configs}.values() if c.name not in futures]
            futures_configs.extend(new)
            groups[name] = len(new)
            for config in new:
                future = pool.submit(_compile_unless_busy, arch, config.to_json())
                future.add_done_callback(lambda f, name=name: done_at.__setitem__(
                    name, round(time.perf_counter() - start, 1)))
                futures[config.name] = future

        slow = {name: lister.submit(_list_group, info, name) for name in SLOW_GROUPS}
        for name, listing in kernel_listings(info):
            if name not in slow:
                try:
                    queue(name, with_twins(listing()))
                except Exception as exc:  # a list that fails costs time, never a test
                    log(f"{name}: kernels not listed ({type(exc).__name__}: {exc})")
        first = {}  # an epilogue variant a family (bias and activation), the tests' first
        for config in reversed(futures_configs):
            epilogue = epilogue_of(config)
            if epilogue.bias and epilogue.activation.value != "none":
                first[config.family] = config
        phases["warm_up_from_s"] = round(time.perf_counter() - start, 1)
        warm_cupy(list(first.values()), log)
        phases["warm_up_to_s"] = round(time.perf_counter() - start, 1)
        for name, listed_there in slow.items():
            try:
                queue(name, [config_from_dict(json.loads(c)) for c in listed_there.result()])
            except Exception as exc:
                log(f"{name}: kernels not listed ({type(exc).__name__}: {exc})")
        phases["slow_listed_s"] = round(time.perf_counter() - start, 1)
        queue("fuzz", fuzz_order(info))
        phases["listed_s"] = round(time.perf_counter() - start, 1)
        log(f"precompile: {len(futures)} kernels listed at {phases['listed_s']} s, {workers} "
            f"processes: {groups}")
        for future in futures.values():
            with contextlib.suppress(Exception):
                future.result()
        stopped = False
    except SystemExit:
        stopped = True
    counts: dict[str, int] = {"compiled": 0, "cached": 0, "busy": 0}
    errors, cpu, done = [], 0.0, 0
    for name, future in list(futures.items()):
        if not future.done() or future.cancelled():
            continue
        done += 1
        try:
            status, used = future.result()
        except Exception as exc:  # a compile process died
            status, used = f"{type(exc).__name__}: {exc}", 0.0
        cpu += used
        if status in counts:
            counts[status] += 1
        else:
            errors.append(f"{name}: {status[:300]}")
    stats = {"kernels": len(futures), "done": done, **counts, "failed": len(errors),
             "stopped": stopped, "errors": errors[:20], "cpu_s": round(cpu, 1),
             "wall_s": round(time.perf_counter() - start, 1), **phases,
             "processes": workers, "warm_up_compiles": COUNT.compiled, "groups": groups,
             "groups_done_at_s": dict(done_at)}
    out.write_text(json.dumps(stats, indent=1) + "\n")
    log(f"precompile: {stats}")
    lister.shutdown(wait=not stopped, cancel_futures=stopped)
    if not stopped:
        pool.shutdown()
    else:
        pool.shutdown(wait=False, cancel_futures=True)
    return stats


def run_suite(workers: int, fresh: bool, limit_s: float, out: Path,
              pytest_args: list[str]) -> int:
    """``pytest -m gpu`` under pytest-xdist (where installed) as on a fresh machine
    (``fresh``: empty kernel caches, CuPy's, nmgen's tables, torch's inductor and Triton);
    pytest's log, the compile process's log and numbers and the record into ``out``.
    Interrupted (SIGINT, so that pytest still reports) after ``limit_s``."""
    import importlib.util
    import shutil
    import subprocess
    import tempfile
    import threading

    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, NMGEN_SUITE_DIR=str(out / "gpu_suite"), PYTHONUNBUFFERED="1",
               NMGEN_TEST_SEED=str(SEED))
    caches = Path(tempfile.mkdtemp(prefix="nmgen-fresh-")) if fresh else None
    if caches is not None:
        env.update(CUPY_CACHE_DIR=str(caches / "cupy"), NMGEN_CACHE_DIR=str(caches / "nmgen"),
                   TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
                   TRITON_CACHE_DIR=str(caches / "triton"))
    dist = ["-n", str(workers), "--dist", "loadgroup"]
    if importlib.util.find_spec("xdist") is None:
        print("pytest-xdist is not installed: the GPU tests run in one process", flush=True)
        dist = []
    command = [sys.executable, "-m", "pytest", "-m", "gpu", *dist, "-q", "-rfE",
               "--durations=40", *pytest_args]
    print(f"{' '.join(command)}  ({os.cpu_count()} CPUs; caches "
          f"{'fresh' if fresh else 'as they are'}; NMGEN_TEST_SEED={SEED})", flush=True)
    start = time.perf_counter()
    with open(out / "pytest.log", "w") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        timers = [threading.Timer(limit_s, process.send_signal, (signal.SIGINT,)),
                  threading.Timer(limit_s + 20, process.kill)]  # if the interrupt hangs
        for timer in timers:
            timer.start()
        for line in process.stdout:
            sys.stdout.write(line)
            log.write(line)
        code = process.wait()
        for timer in timers:
            timer.cancel()
    compile_log = out / "gpu_suite" / "precompile.log"
    if compile_log.exists():  # what the compile process said (its numbers last)
        print("compile process:", *compile_log.read_text().splitlines()[-6:], sep="\n  ")
    print(f"gpu_suite run: pytest exit {code}, {time.perf_counter() - start:.1f} s wall",
          flush=True)
    record = ROOT / "tests" / "gpu_attestation.json"
    if record.exists():
        shutil.copy(record, out / record.name)
    if caches is not None:
        shutil.rmtree(caches, ignore_errors=True)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu_suite")
    sub = parser.add_subparsers(dest="command", required=True)
    suite = sub.add_parser("run", help="the GPU tests and the fuzz, as on a fresh machine")
    suite.add_argument("--workers", type=int, default=12, help="pytest-xdist workers")
    suite.add_argument("--warm", action="store_true", help="keep the kernel caches")
    suite.add_argument("--limit-s", type=float, default=570.0)
    suite.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp"))
    suite.add_argument("pytest_args", nargs=argparse.REMAINDER)
    run = sub.add_parser("precompile", help="compile the GPU tests' kernels ahead")
    run.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    run.add_argument("--out", type=Path, required=True)
    sub.add_parser("list", help="print the kernels the GPU tests compile ahead")
    args = parser.parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.command == "run":
        extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
        return run_suite(args.workers, not args.warm, args.limit_s, args.out, extra)
    if args.command == "list":
        from nmgen.runtime.device import device_info

        for config in suite_kernels(device_info(), log):
            print(config.name)
        return 0
    precompile(args.workers, args.out, log)
    return 0


if __name__ == "__main__":  # as tests.gpu_suite, so that its pool's jobs are found there
    from tests.gpu_suite import main as suite_main

    sys.exit(suite_main())
