"""GPU: ``nmgen selftest``'s random cases of every registered family against float64, and
the minimal failing cases found before (``tests/gpu_regressions.json``) run again.

``NMGEN_FUZZ_CASES`` sets the cases a family (default 10,000: a few minutes on an H100);
the counts go into the GPU record (``fuzz_cases_<family>``, ``fuzz_wrong_<family>``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REGRESSIONS = Path(__file__).resolve().parent / "gpu_regressions.json"
CASES = int(os.environ.get("NMGEN_FUZZ_CASES", "10000"))
SEED = int.from_bytes(os.urandom(4), "little")  # fresh every run; in the failure message


def test_random_cases_of_every_family(gpu_cases):
    from nmgen.bench.selftest import selftest

    outcome = selftest(CASES, SEED, per_config=40, log=print)
    for family, count in outcome.cases.items():
        gpu_cases[f"fuzz_cases_{family}"] = count
        gpu_cases[f"fuzz_wrong_{family}"] = outcome.wrong[family]
    if outcome.failures:  # kept for the next runs, minimal
        known = json.loads(REGRESSIONS.read_text()) if REGRESSIONS.exists() else []
        REGRESSIONS.write_text(json.dumps(known + outcome.failures, indent=1) + "\n")
    assert sum(outcome.cases.values()) >= CASES
    assert not outcome.failures, f"seed {SEED}: {outcome.failures[:3]}"


def test_recorded_minimal_failures_stay_fixed():
    from nmgen.bench.selftest import replay

    failures = json.loads(REGRESSIONS.read_text()) if REGRESSIONS.exists() else []
    assert replay(failures) == []
