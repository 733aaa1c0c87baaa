"""The timer's queue-ahead wait: nvcc compiles it (CPU), and on the GPU the events bracket
the device work of the timed call, not the host time spent making it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from nmgen.compiler import nvrtc
from nmgen.compiler.nvcc import nvcc_path
from nmgen.compiler.pool import AHEAD_NICE, CompilePool
from nmgen.runtime import launch, timing


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_wait_kernel_compiles(tmp_path, arch):
    source = tmp_path / "wait.cu"
    source.write_text(launch._WAIT_SOURCE)
    run = subprocess.run([nvcc_path() or "nvcc", "-cubin", f"-arch={arch}", "-o",
                          str(tmp_path / "wait.cubin"), str(source)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def _host_busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


@pytest.mark.gpu
@pytest.mark.gpu_alone  # times the GPU: no other GPU test beside it
def test_queue_ahead_keeps_host_time_out():
    import cupy as cp

    x = cp.zeros(256, cp.float32)

    def slow_host_fast_kernel(i: int) -> None:
        _host_busy(60.0)  # the host path of a call, longer than the kernel it launches
        x.fill(i)

    with_wait = timing.time_ms(slow_host_fast_kernel, repeat=15)
    without = timing.time_ms(slow_host_fast_kernel, repeat=15, queue_ahead_us=0)
    assert without >= 0.055, without  # the old timer saw the host's 60 us
    assert with_wait < 0.03, with_wait  # the new one sees the fill kernel alone


@pytest.mark.gpu
@pytest.mark.gpu_alone  # times the GPU: no other GPU test beside it
def test_queue_ahead_keeps_device_time_in():
    import numpy as np

    def device_wait(i: int) -> None:
        launch.wait_kernel()((1,), (1,), (np.uint64(200_000),))

    assert 0.195 <= timing.time_ms(device_wait, repeat=9) < 0.26


@pytest.mark.gpu
@pytest.mark.gpu_alone  # times the GPU: no other GPU test beside it
def test_budget_bounds_the_repeats_of_a_long_kernel():
    import numpy as np

    calls = []

    def long_kernel(i: int) -> None:
        calls.append(i)
        launch.wait_kernel()((1,), (1,), (np.uint64(20_000_000),))  # 20 ms on the GPU

    ms = timing.time_ms(long_kernel, warmup=1, repeat=15, budget_ms=50.0)
    assert 19.5 <= ms < 22
    assert len(calls) == 1 + 3  # one warm-up, then three 20 ms calls reach 50 ms
    calls.clear()
    timing.time_ms(lambda i: calls.append(i), warmup=0, repeat=15, budget_ms=50.0)
    assert len(calls) == 15  # short calls: the repeat count decides


def _fake_compile(config_json: str) -> str | None:
    """Stands in for NVRTC (absent on a CPU host): notes each compile in a file, slowly,
    and fails the two-stage kernels."""
    import os

    name = _config_of(config_json).name
    with open(os.environ["NMGEN_TEST_COMPILE_LOG"], "a") as log:
        log.write(f"{name} {os.getpid()}\n")
    time.sleep(0.2)
    return f"{name}: failed (test)" if "_s2_" in name else None


def _config_of(config_json: str):
    """The configuration a compile process gets (as ``nvrtc.compile_one`` rebuilds it)."""
    import json

    from nmgen.families.registry import config_from_dict

    return config_from_dict(json.loads(config_json))


def _configs():
    from nmgen.families.f32_simt.config import KernelConfig

    return [KernelConfig(8, 32, 32, 128, 128, 64, 8, 8, warp_m=8, warp_n=4, stages=s,
                         a_tile=t) for s in (1, 2, 3) for t in ("tk", "tm")]


def test_compile_ahead_once_a_kernel(tmp_path, monkeypatch):
    log = tmp_path / "compiled.txt"
    monkeypatch.setenv("NMGEN_TEST_COMPILE_LOG", str(log))
    configs = _configs()
    with CompilePool(2, ahead_workers=2, compile_one=_fake_compile) as pool:
        assert pool.ahead(configs[:4]) == 4
        assert pool.ahead(configs[:2]) == 0  # queued already
        errors = pool.compile(configs[2:])  # two under way ahead, two not
    compiled = log.read_text().split()[::2]
    assert sorted(compiled) == sorted(c.name for c in configs)  # each exactly once
    assert pool.ahead_stats.kernels == 4 - pool.taken_back  # the rest: in the batch
    assert pool.batch_stats.kernels + pool.ahead_stats.kernels == len(configs)
    assert pool.batch_stats.compiled == pool.ahead_stats.compiled == 0  # slept, no CPU
    assert 0.19 * len(configs) < pool.batch_stats.wall_s + pool.ahead_stats.wall_s < 3.0
    assert sorted(e.split(":")[0] for e in errors) == sorted(
        c.name for c in configs if c.stages == 2)  # failures compiled ahead are reported


def test_processes_start_before_the_target_is_known(monkeypatch):
    """A tuning worker starts its compile processes before it initialises CUDA: starting
    and warming them asks nothing of the GPU (the target is asked at the first kernel and
    sent with each); dry runs and the supervisor of --devices start none."""
    import argparse

    from nmgen.tune.command import start_compile_pool

    asked = []
    monkeypatch.setattr("nmgen.compiler.pool.compile_arch", lambda: asked.append(1) or "90")
    with CompilePool(2, ahead_workers=1) as pool:  # NVRTC's
        pool.start()
        for executor in (pool._executor(), pool._ahead_executor()):
            executor.submit(time.sleep, 0).result()  # started and warmed
        assert asked == []
        assert pool._arch == "90" and asked == [1]  # at the first kernel, once
    args = argparse.Namespace(dry_run=True, devices=None, compile_workers=2, ahead_workers=1)
    assert start_compile_pool(args) is None
    assert start_compile_pool(argparse.Namespace(**{**vars(args), "dry_run": False,
                                                    "devices": "0,1"})) is None


def _locked_compile(config_json: str) -> str | None:
    """Stands in for NVRTC: holds the kernel's host lock (in the test's folder) for 0.3 s,
    burning CPU for the first 0.15 s of it."""
    import os

    name = _config_of(config_json).name
    with nvrtc.host_lock(name, Path(os.environ["NMGEN_TEST_LOCKS"])):
        start = time.process_time()
        while time.process_time() - start < 0.15:
            pass
        time.sleep(0.15)
    return None


def test_compile_stats_count_cpu_and_lock_waits(tmp_path, monkeypatch):
    """Two pools (as two workers of a host) compiling the same kernels at once: each kernel
    burns CPU once per pool, and the pools' waits for each other's lock add up to about
    one holder's time per kernel."""
    import threading

    monkeypatch.setenv("NMGEN_TEST_LOCKS", str(tmp_path))
    configs = _configs()[:2]
    pools = [CompilePool(2, compile_one=_locked_compile) for _ in range(2)]
    for pool in pools:
        pool._executor().submit(time.sleep, 0).result()  # processes started before timing
    threads = [threading.Thread(target=p.compile, args=(configs,)) for p in pools]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for pool in pools:
        pool.close()
    stats = [p.batch_stats for p in pools]
    assert [s.kernels for s in stats] == [2, 2] and [s.compiled for s in stats] == [2, 2]
    assert all(0.15 <= s.cpu_s / s.kernels < 0.3 for s in stats), stats
    waits = sum(s.lock_wait_s for s in stats)
    assert 0.2 <= waits < 0.9, stats  # the later holder of each lock waited ~0.3 s
    assert all(p.ahead_stats.kernels == 0 for p in pools)


def test_submit_returns_while_the_batch_compiles(tmp_path, monkeypatch):
    """A batch submitted is under way, not done; its errors come once it is (a worker
    measures another study's batch meanwhile)."""
    log = tmp_path / "compiled.txt"
    monkeypatch.setenv("NMGEN_TEST_COMPILE_LOG", str(log))
    configs = _configs()
    with CompilePool(3, compile_one=_fake_compile) as pool:
        pool._executor().submit(time.sleep, 0).result()  # processes started
        begun = time.perf_counter()
        batch = pool.submit(configs[:3])
        assert time.perf_counter() - begun < 0.1 and not batch.done()
        errors = batch.errors()
        assert batch.done() and 0.19 < time.perf_counter() - begun < 1.5
    assert [e.split(":")[0] for e in errors] == [c.name for c in configs[:3] if c.stages == 2]
    assert pool.batch_stats.kernels == 3


def test_batches_that_want_one_kernel_share_its_compile(tmp_path, monkeypatch):
    """Two studies' batches at once asking for some of the same kernels: each kernel is
    compiled once, and both batches wait for it and see its error."""
    log = tmp_path / "compiled.txt"
    monkeypatch.setenv("NMGEN_TEST_COMPILE_LOG", str(log))
    configs = _configs()
    with CompilePool(4, ahead_workers=1, compile_one=_fake_compile) as pool:
        first = pool.submit(configs[:4])
        second = pool.submit(configs[2:])  # two of them under way for the first batch
        errors = [first.errors(), second.errors()]
        third = pool.submit(configs[:1])  # compiled already: nothing started again
        assert third.done() and third.errors() == []
        assert pool.ahead(configs) == 0  # all compiled for batches: none queued ahead
    compiled = log.read_text().split()[::2]
    assert sorted(compiled) == sorted(c.name for c in configs)  # each exactly once
    assert pool.batch_stats.kernels == len(configs)
    assert [sorted(e.split(":")[0] for e in batch) for batch in errors] == [
        sorted(c.name for c in part if c.stages == 2) for part in (configs[:4], configs[2:])]


def test_no_ahead_processes_no_ahead_compiles(tmp_path, monkeypatch):
    log = tmp_path / "compiled.txt"
    monkeypatch.setenv("NMGEN_TEST_COMPILE_LOG", str(log))
    with CompilePool(1, ahead_workers=0, compile_one=_fake_compile) as pool:
        assert pool.ahead(_configs()) == 0
        assert pool.compile(_configs()[:1]) == []
    assert log.read_text().split()[::2] == [_configs()[0].name]


def test_queued_ahead_but_not_started_compiles_in_the_batch_pool(tmp_path, monkeypatch):
    log = tmp_path / "compiled.txt"
    monkeypatch.setenv("NMGEN_TEST_COMPILE_LOG", str(log))
    configs = _configs()
    with CompilePool(3, ahead_workers=1, compile_one=_fake_compile) as pool:
        pool.start()
        assert pool.ahead(configs) == len(configs)
        errors = pool.compile(configs)  # one process ahead: most are still queued there
        assert pool.taken_back >= 1 and pool.taken_back + len(pool._ahead) == len(configs)
    lines = [line.split() for line in log.read_text().splitlines()]
    assert sorted(name for name, _ in lines) == sorted(c.name for c in configs)  # once each
    assert len({pid for _, pid in lines}) >= 3  # the batch pool took the queued ones
    assert sorted(e.split(":")[0] for e in errors) == sorted(
        c.name for c in configs if c.stages == 2)


@pytest.mark.gpu
@pytest.mark.gpu_alone  # times the GPU: no other GPU test beside it
def test_time_in_turns_times_each_alike():
    import numpy as np

    def wait(us: int):
        return lambda i: launch.wait_kernel()((1,), (1,), (np.uint64(us * 1000),))

    times = timing.time_in_turns({"short": wait(100), "long": wait(300)}, rounds=3, repeat=5)
    assert 0.095 <= times["short"] < 0.15 and 0.295 <= times["long"] < 0.35, times


def test_host_lock_lets_one_holder_in_at_a_time(tmp_path):
    """Two holders of one kernel's lock (separate opens, as separate processes do) never
    overlap; another kernel's lock does not wait for them."""
    import threading

    spans: dict[str, list[tuple[float, float]]] = {"a": [], "b": []}

    def hold(name: str) -> None:
        with nvrtc.host_lock(name, tmp_path):
            start = time.perf_counter()
            time.sleep(0.2)
            spans[name].append((start, time.perf_counter()))

    threads = [threading.Thread(target=hold, args=(n,)) for n in ("a", "a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (s1, e1), (s2, e2) = sorted(spans["a"])
    assert s2 >= e1  # the second holder of "a" entered after the first left
    assert spans["b"][0][0] < e1  # "b" ran beside the first holder of "a"


def _nice_compile(config_json: str) -> str | None:
    """Stands in for NVRTC: notes each kernel with the niceness of the process compiling it."""
    import os

    with open(os.environ["NMGEN_TEST_COMPILE_LOG"], "a") as log:
        log.write(f"{_config_of(config_json).name} {os.nice(0)}\n")
    return None


def test_ahead_processes_yield_the_cpu_to_the_batch(tmp_path, monkeypatch):
    import os

    log = tmp_path / "compiled.txt"
    monkeypatch.setenv("NMGEN_TEST_COMPILE_LOG", str(log))
    configs = _configs()
    with CompilePool(2, ahead_workers=1, compile_one=_nice_compile) as pool:
        pool.ahead(configs[:1])
        pool.compile(configs[1:3])
        pool._ahead[configs[0].name].result()  # done ahead, not cancelled at the close
    nice = dict(line.split() for line in log.read_text().splitlines())
    base = os.nice(0)
    assert int(nice[configs[0].name]) == min(19, base + AHEAD_NICE)
    assert int(nice[configs[1].name]) == int(nice[configs[2].name]) == base


def _compile_in_pool(arch: str | None, config_json: str) -> tuple[str | None, bool]:
    """Runs in a compile process: a kernel's job as the pool sends it (the target with
    it), then whether the process made a context."""
    from nmgen.compiler.pool import _timed

    error = _timed(nvrtc.compile_one, arch, config_json).error
    return error, nvrtc.has_cuda_context()


@pytest.mark.gpu
def test_compile_processes_fill_the_cache_without_a_cuda_context(tmp_path, monkeypatch):
    """Compile processes (batch and ahead) make no CUDA context on the GPU being timed;
    what they compile is then loaded here from CuPy's cache, not compiled again."""
    import cupy as cp

    from nmgen.codegen import render
    from nmgen.compiler.nvrtc import NVRTC_OPTIONS

    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    configs = _configs()[:2]
    with CompilePool(2, ahead_workers=1) as pool:
        pool.start()  # warmed up before the target is known
        results = [pool._executor().submit(_compile_in_pool, pool._arch,
                                           configs[0].to_json()).result(),
                   pool._ahead_executor().submit(_compile_in_pool, pool._arch,
                                                 configs[1].to_json()).result()]
    assert results == [(None, False), (None, False)]
    cached = sorted(tmp_path.glob("*.cubin"))
    assert len(cached) == 2
    for config in configs:
        module = cp.RawModule(code=render(config).code, options=NVRTC_OPTIONS, backend="nvrtc")
        module.get_function(config.name)  # loads here
    assert sorted(tmp_path.glob("*.cubin")) == cached  # found in the cache: nothing new
