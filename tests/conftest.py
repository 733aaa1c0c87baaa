"""Markers: ``gpu`` tests need CuPy and a GPU; ``nvcc`` tests need nvcc (required in CI
through NMGEN_REQUIRE_NVCC=1); ``gpu_alone`` GPU tests time the GPU and run with no other
GPU test at once. A GPU run that passes writes tests/gpu_attestation.json, also under
pytest-xdist (each test's checked cases reach the controller in its report).

The GPU suite (``python -m tests.gpu_suite run``: ``pytest -m gpu -n 12 --dist loadgroup``
from empty kernel caches, as on a fresh machine):
as the session starts, a compile process (``tests/gpu_suite.py``) compiles every kernel
the GPU tests will compile, in parallel processes, while the workers start and run tests;
the tests that compile for themselves (tuning, benchmarks) and the fuzz's shards run first,
the ``gpu_alone`` ones last. The record names the GPU, the tests passed, their wall time
(the pytest run's), the fuzz's cases a family and its wall time, and what was compiled where.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import fcntl
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nmgen.attestation import RECORD, source_hash

from . import gpu_suite

ROOT = Path(__file__).resolve().parent.parent
# No test reads or writes the user's tuned database (``~/.cache/nmgen/tuned.db``, or an
# ``NMGEN_DB`` of their own): every test process, and what it starts, gets an empty one of
# its own, so a record one test stores cannot change what a later test dispatches.
os.environ["NMGEN_DB"] = str(Path(tempfile.mkdtemp(prefix="nmgen-test-db-")) / "tuned.db")
SHARE_LOCK = "NMGEN_GPU_SHARE_LOCK"  # the file the gpu_alone tests lock alone
SUITE_DIR = "NMGEN_SUITE_DIR"  # where the compile process writes its log and numbers


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def gpu_selected(config) -> bool:
    """Whether this pytest run takes the GPU tests (``-m gpu``), where a compile process pays."""
    expression = (config.getoption("markexpr", "") or "").replace(" ", "")
    return os.environ.get("NMGEN_PRECOMPILE", "1") != "0" and (
        "gpu" in expression and "notgpu" not in expression)


class _Suite:
    """The controller's state: its start, the compile process, what came back."""

    start = time.time()
    process: subprocess.Popen | None = None
    folder: Path | None = None
    compiles: collections.Counter = collections.Counter()
    own_compiles: list[tuple[float, str]] = []  # (CPU-s, test) of the tests' own compiles
    fuzz_spans: list[tuple[float, float]] = []
    cached_at_start = 0  # kernels in CuPy's cache as the session began (0: a fresh machine)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu_alone: a GPU test that times the GPU; no other "
                            "GPU test runs beside it")
    config.addinivalue_line("markers", "xdist_group(name): tests pytest-xdist runs in one "
                            "worker (--dist loadgroup); tests/conftest.py marks those of "
                            "one module-scoped tune")
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller did this
        if gpu_available():
            gpu_suite.share_compiles()
        return
    _Suite.start = time.time()
    _Suite.cached_at_start = _cached_kernels()
    os.environ.setdefault(SHARE_LOCK, str(Path(tempfile.gettempdir())
                                          / f"nmgen-gpu-share-{os.getpid()}.lock"))
    if gpu_available():
        gpu_suite.share_compiles()
        if gpu_selected(config):
            _start_compile_process(config)


def _cached_kernels() -> int:
    """Compiled kernels in CuPy's on-disk cache (none on a fresh machine)."""
    from nmgen.compiler.nvrtc import kernel_cache_dir

    folder = kernel_cache_dir()
    return sum(1 for _ in folder.glob("*.cubin")) + sum(
        1 for _ in folder.glob("nmgen-cubins/*.cubin")) if folder.is_dir() else 0


def _start_compile_process(config) -> None:
    """``python -m tests.gpu_suite precompile`` in a session of its own (so that its pool
    ends with it); the workers, started after this, see ``gpu_suite.SHARED``."""
    folder = Path(os.environ.get(SUITE_DIR) or tempfile.mkdtemp(prefix="nmgen-gpu-suite-"))
    folder.mkdir(parents=True, exist_ok=True)
    workers = int(os.environ.get("NMGEN_PRECOMPILE_WORKERS", os.cpu_count() or 1))
    log = open(folder / "precompile.log", "w")  # noqa: SIM115 (the process's, until it ends)
    _Suite.folder = folder
    _Suite.process = subprocess.Popen(
        [sys.executable, "-m", "tests.gpu_suite", "precompile", "--workers", str(workers),
         "--out", str(folder / "precompile.json")],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    os.environ[gpu_suite.SHARED] = "1"


def _stop_compile_process() -> dict | None:
    """The compile process's numbers; stopped (its whole session) if still at work."""
    process, folder = _Suite.process, _Suite.folder
    if process is None or folder is None:
        return None
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:  # still compiling kernels no test came to want
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)  # it writes its numbers so far
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    _Suite.process = None
    stats = folder / "precompile.json"
    if stats.exists():
        return json.loads(stats.read_text())
    return {"unfinished": True, "returncode": process.returncode,
            "log_tail": (folder / "precompile.log").read_text()[-2000:]}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist names the groups
def pytest_collection_modifyitems(config, items):
    require_nvcc = os.environ.get("NMGEN_REQUIRE_NVCC") == "1"
    have_nvcc = shutil.which("nvcc") is not None
    for item in items:
        if "gpu" in item.keywords and not gpu_available():
            item.add_marker(pytest.mark.skip(reason="no CUDA GPU / CuPy"))
        if "nvcc" in item.keywords and not have_nvcc and not require_nvcc:
            item.add_marker(pytest.mark.skip(reason="nvcc not found"))
        if "tuned_db" in getattr(item, "fixturenames", ()):  # one tune, in one worker
            item.add_marker(pytest.mark.xdist_group("tuned_db"))
    rank = {id(item): (0,) if "gpu" not in item.keywords else
            (1, gpu_suite.order_of(item.nodeid, "gpu_alone" in item.keywords))
            for item in items}
    items.sort(key=lambda item: rank[id(item)])  # stable: file order within a rank


@pytest.fixture(autouse=True)
def _gpu_test_share(request):
    """A GPU test holds the GPU share lock shared (``gpu_alone``: alone), and reports the
    kernels it compiled itself (not found compiled by another process)."""
    if request.node.get_closest_marker("gpu") is None or SHARE_LOCK not in os.environ:
        yield
        return
    alone = request.node.get_closest_marker("gpu_alone") is not None
    with open(os.environ[SHARE_LOCK], "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        before = gpu_suite.COUNT.snapshot()
        try:
            yield
        finally:
            after = gpu_suite.COUNT.snapshot()
            fcntl.flock(handle, fcntl.LOCK_UN)
            request.node.user_properties.append(
                ("gpu_compiles", {k: after[k] - before[k] for k in after}))


_gpu_outcomes: dict[str, int] = {"passed": 0, "failed": 0, "skipped": 0}
GPU_CASES: dict[str, int] = {"kernel_cases": 0}


@pytest.fixture
def gpu_cases(request):
    """Counter that a GPU kernel test adds its checked cases to; they go into the record
    through the test's report (``user_properties``), which reaches the process that writes
    the record also from a pytest-xdist worker."""
    counts: dict[str, int] = collections.defaultdict(int)
    yield counts
    request.node.user_properties.append(("gpu_cases", dict(counts)))


def add_cases(report) -> None:
    """Add what a test's teardown report carries to the run's counts: its checked
    cases to ``GPU_CASES``, its own compiles, the fuzz's span."""
    for name, value in report.user_properties:
        if name == "gpu_cases":
            for key, count in value.items():
                GPU_CASES[key] = GPU_CASES.get(key, 0) + count
        elif name == "gpu_compiles":
            _Suite.compiles.update(value)
            if value.get("compiled"):
                _Suite.own_compiles.append((value["cpu_s"], report.nodeid))
        elif name == "fuzz_span":
            _Suite.fuzz_spans.append(tuple(value))


def pytest_runtest_logreport(report):
    if "gpu" not in report.keywords:
        return
    if report.when == "call" or report.outcome != "passed":
        _gpu_outcomes[report.outcome] = _gpu_outcomes.get(report.outcome, 0) + 1
    if report.when == "teardown":
        add_cases(report)


def suite_numbers(session) -> dict:
    """Wall times and compiles of this pytest run (the record's and the summary's)."""
    spans = _Suite.fuzz_spans
    workers = getattr(session.config.option, "numprocesses", None) or 0
    return {
        "gpu_tests_wall_s": round(time.time() - _Suite.start, 1),
        "fuzz_wall_s": round(max(e for _, e in spans) - min(s for s, _ in spans), 1)
        if spans else None,
        "fuzz_cases_per_config": gpu_suite.FUZZ_PER_CONFIG,
        "fuzz_shards": gpu_suite.FUZZ_SHARDS,
        "xdist_workers": workers,
        "kernels_compiled_in_tests": _Suite.compiles.get("compiled", 0),
        "compile_cpu_s_in_tests": round(_Suite.compiles.get("cpu_s", 0.0), 1),
        "compile_wait_s_in_tests": round(_Suite.compiles.get("wait_s", 0.0), 1),
        "host_cpus": os.cpu_count(),
        "kernels_cached_at_start": _Suite.cached_at_start,
    }


def pytest_sessionfinish(session, exitstatus):
    """Record a complete, passing GPU run (all gpu tests selected, none failed); under
    pytest-xdist the controller records it, from every worker's reports."""
    if hasattr(session.config, "workerinput"):
        return
    numbers = suite_numbers(session)
    precompiled = _stop_compile_process()
    session.config._nmgen_suite = {**numbers, "precompile": precompiled}
    if not gpu_available() or _gpu_outcomes["passed"] == 0:
        return
    if exitstatus != 0 or _gpu_outcomes["failed"] or _gpu_outcomes["skipped"]:
        return
    if session.config.getoption("keyword") or session.config.getoption("lf", default=False):
        return  # a partial selection attests nothing
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    record = {
        "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "compute_capability": f"{props['major']}.{props['minor']}",
        "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
        "cuda_driver": cupy.cuda.runtime.driverGetVersion(),
        "cupy": cupy.__version__,
        "gpu_tests_passed": _gpu_outcomes["passed"],
        "kernel_cases_checked": GPU_CASES["kernel_cases"],
        **{k: v for k, v in sorted(GPU_CASES.items()) if k.startswith("fuzz_")},
        **numbers,
        "precompile": {k: v for k, v in (precompiled or {}).items() if k != "errors"},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source_hash": source_hash(),
    }
    RECORD.write_text(json.dumps(record, indent=2) + "\n")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Where the GPU suite's time went: walls, the compile process, the tests' own
    compiles (the ones that compiled most first)."""
    numbers = getattr(config, "_nmgen_suite", None)
    if not numbers or not any(_gpu_outcomes.values()):
        return
    write = terminalreporter.write_line
    terminalreporter.section("nmgen GPU suite")
    write(json.dumps({k: v for k, v in numbers.items() if k != "precompile"}))
    write(f"compile process: {json.dumps(numbers['precompile'])}")
    if _Suite.folder is not None:
        write(f"compile process log: {_Suite.folder / 'precompile.log'}")
    for cpu_s, nodeid in sorted(_Suite.own_compiles, reverse=True)[:15]:
        write(f"compiled in the test {cpu_s:6.1f} CPU-s  {nodeid}")
