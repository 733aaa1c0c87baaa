"""CI has no GPU: the GPU tests' record must match the kernel-side sources."""

from __future__ import annotations

import json

from nmgen.attestation import RECORD, kernel_side_files, source_hash


def test_gpu_record_matches_the_sources():
    assert RECORD.exists(), (
        f"{RECORD} is missing: run the GPU tests on a GPU (python -m pytest -m gpu) and "
        "commit the record they write")
    record = json.loads(RECORD.read_text())
    assert record["source_hash"] == source_hash(), (
        "kernel-side sources changed since the GPU tests last passed "
        f"({record['date']} on {record['gpu']}): re-run the GPU tests on a GPU "
        "(python -m pytest -m gpu) and commit tests/gpu_attestation.json")
    assert record["gpu_tests_passed"] > 0
    assert record["kernel_cases_checked"] >= 300


def test_hash_covers_templates_and_launch_code():
    names = {p.name for p in kernel_side_files()}
    assert {"nm_spmm_f32.cu.j2", "launch.py", "codegen.py", "prepare.py"} <= names


def test_a_tests_checked_cases_reach_the_record_through_its_report():
    """The counts travel in the teardown report's user_properties (from a pytest-xdist
    worker too) and add up in the process that writes the record."""
    from types import SimpleNamespace

    from . import conftest

    before = dict(conftest.GPU_CASES)

    def teardown(keywords, counts):
        return SimpleNamespace(keywords=keywords, when="teardown", outcome="passed",
                               user_properties=[("other", 1), ("gpu_cases", counts)])

    try:
        conftest.pytest_runtest_logreport(teardown({"gpu": 1}, {"kernel_cases": 3}))
        conftest.pytest_runtest_logreport(teardown({"gpu": 1}, {"kernel_cases": 2,
                                                                "fuzz_cases_gemv": 40}))
        conftest.pytest_runtest_logreport(teardown({}, {"kernel_cases": 7}))  # not a GPU test
        assert conftest.GPU_CASES["kernel_cases"] == before["kernel_cases"] + 5
        assert conftest.GPU_CASES["fuzz_cases_gemv"] == before.get("fuzz_cases_gemv", 0) + 40
    finally:
        conftest.GPU_CASES.clear()
        conftest.GPU_CASES.update(before)
