"""The GPU suite's host side (``tests/gpu_suite.py``): the kernels it lists ahead, one
compile a host under each kernel's lock, the order tests run in, and the fuzz's draws; and
the record's promise that the suite costs minutes (``tests/gpu_attestation.json``)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from nmgen.attestation import RECORD
from nmgen.families.registry import all_families
from nmgen.runtime.device import DeviceInfo

from . import gpu_suite

H200 = DeviceInfo("NVIDIA H200", 132, 9, 0, 13000)
WALL_S = 150  # the GPU tests on a fresh H200 (issue 58)
FUZZ_CASES = 10_000  # a family, at least


def test_the_record_holds_the_suite_to_its_time_and_the_fuzz_to_its_count():
    """The GPU record names the GPU, the tests, both wall times and the fuzz's cases a
    family; the tests took at most WALL_S on a machine whose kernel cache was empty, the
    fuzz checked at least FUZZ_CASES cases of every family beside them."""
    record = json.loads(RECORD.read_text())
    assert record["gpu"] and record["gpu_tests_passed"] >= 252
    assert record["kernels_cached_at_start"] == 0, "not a fresh machine: every kernel compiles"
    assert record["gpu_tests_wall_s"] <= WALL_S, record["gpu_tests_wall_s"]
    assert 0 < record["fuzz_wall_s"] <= record["gpu_tests_wall_s"]
    for family in all_families():
        assert record[f"fuzz_cases_{family.name}"] >= FUZZ_CASES, family.name
        assert record[f"fuzz_wrong_{family.name}"] == 0, family.name


def test_tests_that_compile_for_themselves_run_first_and_timing_tests_last():
    ranks = [gpu_suite.order_of(nodeid, alone) for nodeid, alone in (
        ("tests/test_tune_dispatch_gpu.py::test_tune_finds_a_correct_winner_and_resumes", False),
        ("tests/test_selftest_gpu.py::test_random_cases_of_every_family[f32-0]", False),
        ("tests/test_epilogue_gpu.py::test_every_epilogue_of_every_family_matches_float64"
         "[f32-configs0]", False),
        ("tests/test_kernels_gpu.py::test_random_config_matches_reference[3]", False),
        ("tests/test_timing.py::test_time_in_turns_times_each_alike", True))]
    assert ranks == sorted(ranks) and len(set(ranks)) == 5


def test_a_kernel_compiles_once_a_host_under_its_lock(tmp_path, monkeypatch):
    """A second process wanting a kernel under way waits for it (then finds it cached);
    asked not to wait, it is told at once; the compile's CPU time is counted."""
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gpu_suite, "COUNT", gpu_suite.CompileCount())

    class Module:
        def compile(self):
            start = time.process_time()
            while time.process_time() - start < 0.15:  # NVRTC's CPU time
                pass

    compile_locked = gpu_suite.compile_under_lock(lambda code, target=None: Module())
    name = gpu_suite.lock_name("code", None)
    assert name != gpu_suite.lock_name("code", "sm_90a") != gpu_suite.lock_name("other", None)
    held = threading.Event()
    release = threading.Event()

    def holder():
        with gpu_suite.kernel_lock(name):
            held.set()
            release.wait(5)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    assert compile_locked("code", None, blocking=False) is None  # busy: not waited for
    assert isinstance(compile_locked("other", None, blocking=False), Module)
    threading.Timer(0.3, release.set).start()
    start = time.perf_counter()
    assert isinstance(compile_locked("code", None), Module)  # waited, then compiled
    thread.join()
    assert time.perf_counter() - start >= 0.25
    count = gpu_suite.COUNT
    assert count.compiled == 2 and count.cpu_s >= 0.3 and count.wait_s >= 0.25


@pytest.fixture
def on_an_h200(monkeypatch):
    """The listing's device: an H200 (the tests' draws ask the current device)."""
    from . import test_mma_gpu, test_wgmma_gpu

    for module in (test_mma_gpu, test_wgmma_gpu):
        monkeypatch.setattr(module, "device_info", lambda: H200)
    return H200


def test_the_listing_names_the_tests_kernels_once_with_their_twins(on_an_h200):
    from . import test_epilogue_gpu, test_kernels_gpu, test_wgmma_gpu

    listings = dict(gpu_suite.kernel_listings(on_an_h200))
    groups = {name: gpu_suite.with_twins(listings[name]()) for name in (
        *gpu_suite.HEAVY_GROUPS, "test_graph_capture_gpu", "test_kernels_gpu")}
    names = [c.name for group in groups.values() for c in group]
    assert len(listings["epilogue variants"]()) == sum(
        len(configs) for configs in (test_epilogue_gpu.F32, test_epilogue_gpu.GEMV,
                                     test_epilogue_gpu.MMA, test_epilogue_gpu.WGMMA)
    ) * test_epilogue_gpu.EPILOGUES_A_CONFIG
    assert {test_kernels_gpu.random_config(i)[0].name for i in range(3)} <= set(names)
    assert len(groups["wgmma random"]) == test_wgmma_gpu.CONFIGS
    tma = [c for c in groups["test_kernels_gpu"] if c.tma and not c.a_copied]
    assert tma and all(c.cp_async_twin().name in names for c in tma)
    fuzz = gpu_suite.fuzz_order(on_an_h200)
    assert len({c.name for c in fuzz}) == len(fuzz) == len(all_families()) * -(
        -gpu_suite.FUZZ_CASES // gpu_suite.FUZZ_PER_CONFIG)


def test_the_fuzz_draws_from_the_seed_alone_and_its_shards_split_the_cases():
    from nmgen.bench.selftest import config_cases, family_configs
    from nmgen.gpus import Arch, gpu_spec

    from .test_selftest_gpu import shard_cases

    gemv = next(f for f in all_families() if f.name == "gemv")
    first = family_configs(gemv, 7, 1000, 100, Arch.SM90, gpu_spec("h200"))
    assert [c.name for c in first] == [
        c.name for c in family_configs(gemv, 7, 1000, 100, Arch.SM90, gpu_spec("h200"))]
    assert len(first) == 10 and first != family_configs(gemv, 8, 1000, 100, Arch.SM90,
                                                         gpu_spec("h200"))
    cases = config_cases(first[0], 7, 30, 384)
    assert cases == config_cases(first[0], 7, 30, 384) and len(cases) == 30
    assert [c.rows for c in cases[:6]] == [1, 2, 3, 17, 64, 255]  # the M edges first
    assert sum(shard_cases(i) for i in range(gpu_suite.FUZZ_SHARDS)) == gpu_suite.FUZZ_CASES


def test_the_compile_process_passes_over_a_kernel_a_test_is_compiling(tmp_path, monkeypatch):
    """A compile process's job: compiled into the cache (here an sm_90a cubin through a
    stand-in NVRTC), found there the next time, and passed over ("busy") while a test
    process holds the kernel's lock."""
    import sys
    import types

    import nmgen
    from nmgen.compiler import nvrtc

    from .test_wgmma import CONFIG, _FakeNvrtc

    fake = _FakeNvrtc()
    libs = types.ModuleType("libs")
    libs.nvrtc = fake
    for name, module in (("cupy_backends", types.ModuleType("cupy_backends")),
                         ("cupy_backends.cuda", types.ModuleType("cuda")),
                         ("cupy_backends.cuda.libs", libs),
                         ("cupy_backends.cuda.libs.nvrtc", fake)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(nvrtc, "cupy", lambda: None)
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    source = nmgen.render(CONFIG)
    with gpu_suite.kernel_lock(gpu_suite.lock_name(source.code, source.target)):
        assert gpu_suite._compile_unless_busy(None, CONFIG.to_json())[0] == "busy"
    assert fake.compiles == 0
    assert gpu_suite._compile_unless_busy(None, CONFIG.to_json())[0] in ("compiled", "cached")
    assert gpu_suite._compile_unless_busy(None, CONFIG.to_json())[0] == "cached"
    assert fake.compiles == 1 and len(list((tmp_path / "nmgen-cubins").glob("*.cubin"))) == 1


def test_the_epilogue_rotation_gives_every_family_every_epilogue_and_every_config_a_bias():
    from . import test_epilogue_gpu as t

    assert len(t.EPILOGUES) == len(set(t.EPILOGUES)) == 9
    for seed in range(len(t.EPILOGUES)):
        for configs in (t.F32, t.GEMV, t.MMA, t.WGMMA):
            chosen = t.variants(configs, seed)
            assert {c.epilogue for c in chosen} == set(t.EPILOGUES)
            for i in range(len(configs)):
                mine = chosen[i * t.EPILOGUES_A_CONFIG:(i + 1) * t.EPILOGUES_A_CONFIG]
                assert any(c.epilogue.bias for c in mine), (seed, configs[i].name)
                assert len({c.epilogue for c in mine}) == t.EPILOGUES_A_CONFIG
    pairs = {(c.name, c.epilogue) for seed in range(9) for c in t.variants(t.F32, seed)}
    assert len(pairs) == len(t.F32) * 9, "over the seeds, every pairing is run"
