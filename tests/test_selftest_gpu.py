"""GPU: ``nmgen selftest``'s random cases of every registered family against float64, and
the minimal failing cases found before (``tests/gpu_regressions.json``) run again.

A family's cases (``NMGEN_FUZZ_CASES``, default 10,000) come ``NMGEN_FUZZ_PER_CONFIG`` a
compiled configuration (default 200: the shapes and data change, the compile is paid once),
split between ``NMGEN_FUZZ_SHARDS`` tests (default 4) that pytest-xdist runs beside the
other GPU tests; the suite's compile process compiles their configurations ahead
(``tests/gpu_suite.py``). The counts go into the GPU record (``fuzz_cases_<family>``,
``fuzz_wrong_<family>``, and the fuzz's wall time from its first shard's start to its last
one's end)."""

from __future__ import annotations

import fcntl
import json
import tempfile
import time
from pathlib import Path

import pytest

from nmgen.families.registry import all_families

from .gpu_suite import FUZZ_CASES, FUZZ_MAX_SIZE, FUZZ_PER_CONFIG, FUZZ_SHARDS, SEED

pytestmark = pytest.mark.gpu

REGRESSIONS = Path(__file__).resolve().parent / "gpu_regressions.json"


def shard_cases(shard: int) -> int:
    """The cases of one family that shard ``shard`` runs (its configurations' counts)."""
    counts = [min(FUZZ_PER_CONFIG, FUZZ_CASES - i * FUZZ_PER_CONFIG)
              for i in range(-(-FUZZ_CASES // FUZZ_PER_CONFIG))]
    return sum(counts[shard::FUZZ_SHARDS])


@pytest.mark.parametrize("shard", range(FUZZ_SHARDS))
@pytest.mark.parametrize("family", [f.name for f in all_families()])
def test_random_cases_of_every_family(family, shard, gpu_cases, record_property):
    from nmgen.bench.selftest import fuzz_arch, selftest
    from nmgen.families.registry import get
    from nmgen.runtime.device import device_info

    if fuzz_arch(get(family), device_info().arch) is None:
        pytest.skip(f"{family} serves no problem on {device_info().arch.value} or older")
    start = time.time()
    outcome = selftest(FUZZ_CASES, SEED, per_config=FUZZ_PER_CONFIG, max_size=FUZZ_MAX_SIZE,
                       families=[get(family)], workers=0, shard=(shard, FUZZ_SHARDS),
                       log=print)
    record_property("fuzz_span", (start, time.time()))
    for name, count in outcome.cases.items():
        gpu_cases[f"fuzz_cases_{name}"] += count
        gpu_cases[f"fuzz_wrong_{name}"] += outcome.wrong[name]
    if outcome.failures:  # kept for the next runs, minimal
        lock_file = Path(tempfile.gettempdir()) / "nmgen-gpu-regressions.lock"
        with open(lock_file, "a") as lock:  # shards write in turn
            fcntl.flock(lock, fcntl.LOCK_EX)
            known = json.loads(REGRESSIONS.read_text()) if REGRESSIONS.exists() else []
            REGRESSIONS.write_text(json.dumps(known + outcome.failures, indent=1) + "\n")
    assert outcome.cases.get(family, 0) == shard_cases(shard)
    assert not outcome.failures, f"seed {SEED}: {outcome.failures[:3]}"


def test_recorded_minimal_failures_stay_fixed():
    from nmgen.bench.selftest import replay

    failures = json.loads(REGRESSIONS.read_text()) if REGRESSIONS.exists() else []
    assert replay(failures) == []
