"""Compiling many kernels ahead of timing in a pool of processes (NVRTC into CuPy's cache,
no CUDA context of their own): a tuning worker's batch compiles while another study's is
timed, and spare processes compile the next studies' seeds."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

from .nvrtc import (
    cache_only,
    compile_arch,
    compile_one,
    lock_wait_seconds,
    start_compile_process,
    warm,
)

# Niceness of the processes that compile ahead: what a batch waits for comes first; the
# seeds of later studies fill the idle cores (two workers on two H200s share 32 CPUs; a
# study took from 21 % less to 33 % more time on one of them than on a lone worker:
# docs/engineering-notes.md §9-10).
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


def _timed(compile_one: Callable[[str], str | None], arch: str | None,
           config_json: str) -> CompileTime:
    """Worker: ``compile_one`` with its CPU, wall and lock-wait time; for the target
    ``arch`` where NVRTC compiles (``nvrtc.cache_only``: no CUDA context here)."""
    if arch is not None:
        cache_only(arch)
    lock_wait, cpu, wall = lock_wait_seconds(), time.process_time(), time.perf_counter()
    error = compile_one(config_json)
    return CompileTime(error, time.process_time() - cpu, time.perf_counter() - wall,
                       lock_wait_seconds() - lock_wait)


@dataclass
class CompileStats:
    """What one pool's processes did (the tuner logs it at the end: where compile time
    goes when several workers share a host, docs/engineering-notes.md §9-10)."""

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
                 compile_one: Callable[[str], str | None] = compile_one):
        self.workers = workers
        self.ahead_workers = ahead_workers
        self.compile_one = compile_one  # a module-level function (it crosses processes)
        self._pool: ProcessPoolExecutor | None = None
        self._ahead_pool: ProcessPoolExecutor | None = None
        self._ahead: dict[str, Future] = {}
        # Every batch compile by kernel name: a batch that wants a kernel another batch is
        # compiling (several studies at once) waits for that compile instead of starting a
        # second one, which would hold a process on the kernel's host lock (3.9-6.3 s a run,
        # docs/engineering-notes.md §9; 26 s in a full tune).
        self._batches: dict[str, Future] = {}
        self.taken_back = 0  # queued ahead, then compiled here before an ahead process began
        self.batch_stats, self.ahead_stats = CompileStats(), CompileStats()

    def compile(self, configs: Sequence[Any]) -> list[str]:
        """Compile ``configs``; return the errors (empty when none)."""
        return self.submit(configs).errors()

    def submit(self, configs: Sequence[Any]) -> CompileBatch:
        """Start compiling ``configs`` and return at once: the tuner measures another
        study's batch meanwhile (``workers.run_worker``)."""
        for config in configs:  # queued ahead but not started: compiled here instead
            future = self._ahead.get(config.name)
            if future is not None and future.cancel():
                del self._ahead[config.name]
                self.taken_back += 1
        waiting = [(c.name, self._ahead[c.name]) for c in configs if c.name in self._ahead]
        timed = functools.partial(_timed, self.compile_one)
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

    def _submit(self, timed: Callable[[str | None, str], CompileTime], config: Any) -> Future:
        if self.workers <= 1:  # no processes: compiled here (CuPy as it is), at once
            future: Future = Future()
            future.set_result(timed(None, config.to_json()))
        else:
            future = self._executor().submit(timed, self._arch, config.to_json())
        future.add_done_callback(_count_in(self.batch_stats))
        return future

    def start(self) -> None:
        """Start every process now (each loads CuPy and NVRTC, seconds), so that this
        overlaps with the caller's own set-up instead of delaying the first batch. Nothing
        asks the GPU here: a worker starts its processes before it initialises CUDA
        (``tune.command.start_compile_pool``)."""
        for count, executor in ((self.workers, self._executor()),
                                (self.ahead_workers, self._ahead_executor())):
            for _ in range(count if executor is not None else 0):
                executor.submit(warm)

    def ahead(self, configs: Sequence[Any]) -> int:
        """Queue ``configs`` for the ahead processes (none: nothing happens); returns how
        many were new (neither queued ahead nor compiled for a batch before)."""
        pool = self._ahead_executor()
        if pool is None:
            return 0
        new = [c for c in dict.fromkeys(configs)
               if c.name not in self._ahead and c.name not in self._batches]
        for config in new:
            future = pool.submit(_timed, self.compile_one, self._arch, config.to_json())
            future.add_done_callback(_count_in(self.ahead_stats))
            self._ahead[config.name] = future
        return len(new)

    def _ahead_executor(self) -> ProcessPoolExecutor | None:
        if self.ahead_workers <= 0:
            return None
        if self._ahead_pool is None:
            self._ahead_pool = ProcessPoolExecutor(self.ahead_workers,
                                                   mp_context=get_context("spawn"),
                                                   initializer=start_compile_process,
                                                   initargs=(AHEAD_NICE,))
        return self._ahead_pool

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"),
                                             initializer=start_compile_process,
                                             initargs=(0,))
        return self._pool

    @functools.cached_property
    def _arch(self) -> str | None:
        """The compile target, asked once here at the first kernel (a compile process
        asking would make a CUDA context of its own) and sent with each; only NVRTC
        compiles need it."""
        return compile_arch() if self.compile_one is compile_one else None

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


def precompile(configs: Sequence[Any], workers: int = 8) -> list[str]:
    """Compile ``configs`` in a one-off pool; return the errors (empty when none)."""
    with CompilePool(workers) as pool:
        return pool.compile(configs)
