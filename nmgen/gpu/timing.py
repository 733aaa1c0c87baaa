"""Timing on the device (DESIGN §4): CUDA events, warm-up, median of repeats, and
compiling many kernels ahead of timing in a process pool."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import math
import os
import statistics
import time
import types
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from ..codegen import render
from ..config import KernelConfig
from .launch import NVRTC_OPTIONS, _cupy, _wait_kernel

QUEUE_AHEAD_US = 100.0  # longer than a dispatch call's host path (~20-35 us)


def time_ms(fn: Callable[[int], object], warmup: int = 3, repeat: int = 20,
            queue_ahead_us: float = QUEUE_AHEAD_US, budget_ms: float = math.inf,
            min_repeat: int = 3) -> float:
    """Median milliseconds of ``fn(i)`` (``i`` lets the caller rotate inputs) on the device,
    timed with CUDA events on the current stream after ``warmup`` untimed calls. Each
    timed call is queued behind a ``queue_ahead_us`` wait on the GPU, so the host's cost
    of making the call stays out of the figure (0: no wait, host gaps included). Timing
    stops after ``repeat`` calls, or once ``min_repeat`` calls have taken ``budget_ms`` of
    GPU time (as Triton's ``do_bench`` sizes its repeats): long kernels vary little and a
    tuner times hundreds of them."""
    cp = _cupy()
    for i in range(warmup):
        fn(i)
    stream = cp.cuda.get_current_stream()
    wait_ns = np.uint64(queue_ahead_us * 1000)
    times = []
    for i in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        if queue_ahead_us > 0:
            _wait_kernel()((1,), (1,), (wait_ns,), stream=stream)
        start.record(stream)
        fn(i)
        stop.record(stream)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
        if len(times) >= min_repeat and sum(times) >= budget_ms:
            break
    return statistics.median(times)


def time_in_turns(fns: dict[str, Callable[[int], object]], rounds: int = 3,
                  repeat: int = 10, warmup: int = 1,
                  queue_ahead_us: float = QUEUE_AHEAD_US) -> dict[str, float]:
    """Median milliseconds of each of ``fns``, timed ``rounds`` times in turns (``repeat``
    calls a turn), so that a drift of the clocks (a GPU still hot from the check's float64
    product, say) touches each alike instead of whichever was timed first."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(time_ms(fn, warmup=warmup, repeat=repeat,
                                         queue_ahead_us=queue_ahead_us))
    return {name: statistics.median(v) for name, v in samples.items()}


def kernel_cache_dir() -> Path:
    """CuPy's on-disk kernel cache (``CUPY_CACHE_DIR``, else its default)."""
    return Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")


_lock_wait_s = 0.0  # this process's time waiting in ``host_lock``, summed


@contextlib.contextmanager
def host_lock(name: str, folder: Path | None = None):
    """Only one process of this host at a time holds ``name``'s lock. Around a kernel's
    compile, the workers of one host (``--devices``), which share CuPy's cache, compile
    each kernel once: the others wait, then find it in the cache (both compiled the seeds
    every study starts with, results/scale_h200x2/README.md)."""
    global _lock_wait_s
    folder = folder or kernel_cache_dir() / "nmgen-locks"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "a") as handle:
        start = time.perf_counter()
        fcntl.flock(handle, fcntl.LOCK_EX)
        _lock_wait_s += time.perf_counter() - start
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _compile_one(config_json: str) -> str | None:
    """Worker: compile through NVRTC so that CuPy's on-disk cache holds the result (in a
    compile process, only there: ``_cache_only``)."""
    cp = _cupy()
    config = KernelConfig.from_json(config_json)
    try:
        with host_lock(config.name):
            cp.RawModule(code=render(config).code, options=NVRTC_OPTIONS,
                         backend="nvrtc").compile()
    except Exception as exc:  # reported, not raised: one bad kernel must not stop a batch
        return f"{config.name}: {exc}"
    return None


def compile_arch() -> str | None:
    """The target CuPy compiles for on this process's GPU (as its cache key has it), or
    ``None`` where CuPy or a GPU is missing (the CPU tests)."""
    try:
        from cupy.cuda import compiler

        return compiler._get_arch()
    except Exception:  # no CuPy, no driver, no GPU: compile processes load as before
        return None


def _cache_only(arch: str) -> bool:
    """Compile process: compile for ``arch`` into CuPy's on-disk cache, and stop there.

    CuPy's compile-and-cache step asks the GPU for its compute capability and ends by
    loading the module; both make a CUDA context of this process on the GPU the tuning
    worker times kernels on (contexts of separate processes share a GPU by time slices),
    and cost its start-up the context. The process launches nothing, so the target comes
    from the worker and the load is skipped; the worker then loads the cubin from the
    cache under the same key. Returns whether CuPy's compiler was as expected (if not,
    nothing changes: compiling makes a context as before)."""
    try:
        from cupy.cuda import compiler, function
    except ImportError:
        return False
    if not all(hasattr(compiler, a) for a in ("_get_arch", "function", "_compile_with_cache_cuda")):
        return False

    class CacheOnlyModule(function.Module):
        def load(self, cubin: bytes) -> None:  # kept in the disk cache, not on the GPU
            pass

    compiler._get_arch = lambda: arch
    compiler.function = types.SimpleNamespace(Module=CacheOnlyModule,
                                              LinkState=function.LinkState)
    return True


def _start_compile_process(niceness: int, arch: str | None) -> None:
    """Initializer of a compile process: a lower CPU priority where asked (``AHEAD_NICE``),
    and no CUDA context where the target is known (``_cache_only``)."""
    if niceness:
        os.nice(niceness)
    if arch is not None:
        _cache_only(arch)


def has_cuda_context() -> bool:
    """Whether this process has made a CUDA context current (the GPU tests' check that the
    compile processes make none)."""
    driver = _cupy().cuda.driver
    try:
        return driver.ctxGetCurrent() != 0
    except driver.CUDADriverError:  # the driver not even initialized: no context
        return False


_WARM_SOURCE = 'extern "C" __global__ void nmgen_warm() {}'


def _warm() -> None:
    """Worker: pay a process's one-time costs now, beside the tuner's own set-up, instead of
    in its first kernel: loading CuPy and NVRTC and the CUDA driver (on an H100, the first
    compile of 16 fresh processes took ~2 s longer than the next, and their first CUDA call
    up to 2.2 s when all 16 made it at once: results/scale_h200x2/README.md)."""
    try:
        cp = _cupy()
    except RuntimeError:  # no CuPy: the CPU tests' fake compilers need none
        return
    cp.RawModule(code=_WARM_SOURCE, options=NVRTC_OPTIONS, backend="nvrtc").compile()


# Niceness of the processes that compile ahead: what a batch waits for comes first; the
# seeds of later studies fill the idle cores (two workers on two H200s share 32 CPUs; a
# study took from 21 % less to 33 % more time on one of them than on a lone worker:
# results/scale_h200x2/README.md).
AHEAD_NICE = 10


# A compile that used less CPU than this found its kernel in CuPy's cache (loading and
# rendering take milliseconds; NVRTC takes 0.5-2 s for these kernels).
COMPILED_CPU_S = 0.1


@dataclass(frozen=True)
class CompileTime:
    """One kernel's compile in a compile process."""

    error: str | None
    cpu_s: float  # this process's CPU time (NVRTC runs in the process)
    wall_s: float
    lock_wait_s: float  # waiting for another process compiling the same kernel


def _timed(compile_one: Callable[[str], str | None], config_json: str) -> CompileTime:
    """Worker: ``compile_one`` with its CPU, wall and lock-wait time."""
    lock_wait, cpu, wall = _lock_wait_s, time.process_time(), time.perf_counter()
    error = compile_one(config_json)
    return CompileTime(error, time.process_time() - cpu, time.perf_counter() - wall,
                       _lock_wait_s - lock_wait)


@dataclass
class CompileStats:
    """What one pool's processes did (the tuner logs it at the end: where compile time
    goes when several workers share a host, results/scale_h200x2/README.md)."""

    kernels: int = 0
    compiled: int = 0  # used NVRTC, not CuPy's cache
    cpu_s: float = 0.0
    wall_s: float = 0.0
    lock_wait_s: float = 0.0

    def add(self, record: CompileTime) -> None:
        self.kernels += 1
        self.compiled += record.cpu_s >= COMPILED_CPU_S
        self.cpu_s += record.cpu_s
        self.wall_s += record.wall_s
        self.lock_wait_s += record.lock_wait_s

    def __str__(self) -> str:
        per = f", {self.cpu_s / self.compiled:.2f} CPU-s each" if self.compiled else ""
        return (f"{self.kernels} kernels, {self.compiled} compiled{per}; {self.cpu_s:.1f} "
                f"CPU-s in {self.wall_s:.1f} s, {self.lock_wait_s:.1f} s waiting for "
                "another process compiling the same kernel")


def _outcome(name: str, future: Future) -> str | None:
    try:
        return future.result().error
    except Exception as exc:  # the process died: the kernel is reported, not the tuner
        return f"{name}: {type(exc).__name__}: {exc}"


def _failed(future: Future) -> bool:
    """Whether ``future`` ended without a result (its process died, or it was cancelled)."""
    return future.done() and (future.cancelled() or future.exception() is not None)


def _count_in(stats: CompileStats) -> Callable[[Future], None]:
    """A done-callback adding a finished compile's times to ``stats``."""
    def count(future: Future) -> None:
        if not future.cancelled() and future.exception() is None:
            stats.add(future.result())
    return count


@dataclass
class CompileBatch:
    """A batch of kernels under way in a ``CompilePool`` (some of them perhaps compiled
    ahead): ``done`` asks, ``errors`` waits."""

    futures: list[tuple[str, Future]]  # (kernel name, its compile)

    def done(self) -> bool:
        return all(future.done() for _, future in self.futures)

    def errors(self) -> list[str]:
        """Wait for every kernel; the errors (empty when none)."""
        return [e for name, future in self.futures if (e := _outcome(name, future))]


class CompilePool:
    """Worker processes that compile through NVRTC ahead of timing, started once and
    reused (starting a process that imports CuPy costs seconds).

    ``ahead_workers`` more processes compile what is needed next (``ahead``: the seeds of
    the studies after the current one) while the current study is compiled and timed:
    tuning is compile-bound and one study's batch leaves most of the host's cores idle.
    ``compile`` waits for a kernel already under way ahead, or for another batch, instead
    of compiling it twice, and takes back the ones still queued ahead, so that a study's
    first batch, queued ahead, gets both pools' processes.
    """

    def __init__(self, workers: int = 8, ahead_workers: int = 0,
                 compile_one: Callable[[str], str | None] = _compile_one):
        self.workers = workers
        self.ahead_workers = ahead_workers
        self._compile_one = compile_one  # a module-level function (it crosses processes)
        self._pool: ProcessPoolExecutor | None = None
        self._ahead_pool: ProcessPoolExecutor | None = None
        self._ahead: dict[str, Future] = {}
        # Every batch compile by kernel name: a batch that wants a kernel another batch is
        # compiling (several studies at once) waits for that compile instead of starting a
        # second one, which would hold a process on the kernel's host lock (3.9-6.3 s a run,
        # results/scale_h200x2/README.md, run 26; 26 s in a full tune).
        self._batches: dict[str, Future] = {}
        self.taken_back = 0  # queued ahead, then compiled here before an ahead process began
        self.batch_stats, self.ahead_stats = CompileStats(), CompileStats()

    def compile(self, configs: Sequence[KernelConfig]) -> list[str]:
        """Compile ``configs``; return the errors (empty when none)."""
        return self.submit(configs).errors()

    def submit(self, configs: Sequence[KernelConfig]) -> CompileBatch:
        """Start compiling ``configs`` and return at once: the tuner measures another
        study's batch meanwhile (``workers.run_worker``)."""
        for config in configs:  # queued ahead but not started: compiled here instead
            future = self._ahead.get(config.name)
            if future is not None and future.cancel():
                del self._ahead[config.name]
                self.taken_back += 1
        waiting = [(c.name, self._ahead[c.name]) for c in configs if c.name in self._ahead]
        timed = functools.partial(_timed, self._compile_one)
        jobs = []
        for config in configs:
            if config.name in self._ahead:
                continue
            future = self._batches.get(config.name)
            if future is None or _failed(future):  # a process that died: tried again
                future = self._submit(timed, config)
                self._batches[config.name] = future
            jobs.append((config.name, future))
        return CompileBatch(jobs + waiting)

    def _submit(self, timed: Callable[[str], CompileTime], config: KernelConfig) -> Future:
        if self.workers <= 1:  # no processes: compiled here, before this returns
            future: Future = Future()
            future.set_result(timed(config.to_json()))
        else:
            future = self._executor().submit(timed, config.to_json())
        future.add_done_callback(_count_in(self.batch_stats))
        return future

    def start(self) -> None:
        """Start every process now (each loads CuPy, seconds), so that this overlaps with
        the caller's own set-up instead of delaying the first batch."""
        for count, executor in ((self.workers, self._executor()),
                                (self.ahead_workers, self._ahead_executor())):
            for _ in range(count if executor is not None else 0):
                executor.submit(_warm)

    def ahead(self, configs: Sequence[KernelConfig]) -> int:
        """Queue ``configs`` for the ahead processes (none: nothing happens); returns how
        many were new (neither queued ahead nor compiled for a batch before)."""
        pool = self._ahead_executor()
        if pool is None:
            return 0
        new = [c for c in dict.fromkeys(configs)
               if c.name not in self._ahead and c.name not in self._batches]
        for config in new:
            future = pool.submit(_timed, self._compile_one, config.to_json())
            future.add_done_callback(_count_in(self.ahead_stats))
            self._ahead[config.name] = future
        return len(new)

    def _ahead_executor(self) -> ProcessPoolExecutor | None:
        if self.ahead_workers <= 0:
            return None
        if self._ahead_pool is None:
            self._ahead_pool = ProcessPoolExecutor(self.ahead_workers,
                                                   mp_context=get_context("spawn"),
                                                   initializer=_start_compile_process,
                                                   initargs=(AHEAD_NICE, self._arch))
        return self._ahead_pool

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"),
                                             initializer=_start_compile_process,
                                             initargs=(0, self._arch))
        return self._pool

    @functools.cached_property
    def _arch(self) -> str | None:
        """The compile target, asked once here (a compile process asking would make a
        CUDA context of its own); only NVRTC compiles need it."""
        return compile_arch() if self._compile_one is _compile_one else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
            self._batches.clear()
        if self._ahead_pool is not None:
            self._ahead_pool.shutdown(cancel_futures=True)
            self._ahead_pool = None
            self._ahead.clear()

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def precompile(configs: Sequence[KernelConfig], workers: int = 8) -> list[str]:
    """Compile ``configs`` in a one-off pool; return the errors (empty when none)."""
    with CompilePool(workers) as pool:
        return pool.compile(configs)
