"""Markers: ``gpu`` tests need CuPy and a GPU; ``nvcc`` tests need nvcc (required in CI
through NMGEN_REQUIRE_NVCC=1). A GPU run that passes writes tests/gpu_attestation.json,
also under pytest-xdist (``-n 4``: the workers compile apart; each test's checked cases
reach the controller in its report)."""

from __future__ import annotations

import collections
import datetime
import functools
import json
import os
import shutil

import pytest

from nmgen.attestation import RECORD, source_hash


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    require_nvcc = os.environ.get("NMGEN_REQUIRE_NVCC") == "1"
    have_nvcc = shutil.which("nvcc") is not None
    for item in items:
        if "gpu" in item.keywords and not gpu_available():
            item.add_marker(pytest.mark.skip(reason="no CUDA GPU / CuPy"))
        if "nvcc" in item.keywords and not have_nvcc and not require_nvcc:
            item.add_marker(pytest.mark.skip(reason="nvcc not found"))


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
    """Add the checked cases a test's teardown report carries to ``GPU_CASES``."""
    for name, counts in report.user_properties:
        if name == "gpu_cases":
            for key, value in counts.items():
                GPU_CASES[key] = GPU_CASES.get(key, 0) + value


def pytest_runtest_logreport(report):
    if "gpu" not in report.keywords:
        return
    if report.when == "call" or report.outcome != "passed":
        _gpu_outcomes[report.outcome] = _gpu_outcomes.get(report.outcome, 0) + 1
    if report.when == "teardown":
        add_cases(report)


def pytest_sessionfinish(session, exitstatus):
    """Record a complete, passing GPU run (all gpu tests selected, none failed); under
    pytest-xdist the controller records it, from every worker's reports."""
    if hasattr(session.config, "workerinput"):
        return
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
        **{k: v for k, v in GPU_CASES.items() if k.startswith("fuzz_")},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source_hash": source_hash(),
    }
    RECORD.write_text(json.dumps(record, indent=2) + "\n")
