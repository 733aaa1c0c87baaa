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
