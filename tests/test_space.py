"""The search space: the core benchmark's hand-picked kernels, the enumeration's disk cache."""

from __future__ import annotations

import json
from pathlib import Path

from nmgen.config import ALayout
from nmgen.space import CORE_BEST, Problem, core_config

CORE_RUN = Path(__file__).resolve().parent.parent / "results" / "core_tma_h100" / "bench_core.json"


def test_core_table_is_the_committed_core_benchmark():
    """CORE_BEST names, per pattern and A layout, the fastest correct configuration of the
    committed core run."""
    run = json.loads(CORE_RUN.read_text())
    fastest: dict[tuple[str, str], dict] = {}
    for row in run["rows"]:
        key = (row["pattern"], row["a_layout"])
        if row["ok"] and (key not in fastest or row["ms"] < fastest[key]["ms"]):
            fastest[key] = row
    assert len(fastest) == len(CORE_BEST) == 8
    for (n, m, layout) in CORE_BEST:
        config = core_config(Problem(n, m, run["vec"], a_layout=layout))
        assert config.name == fastest[(f"{n}:{m}", layout.value)]["config"]


def test_core_config_only_for_the_benchmarked_patterns():
    assert core_config(Problem(2, 4, 32)) is None
    assert core_config(Problem(8, 32, 32, a_layout=ALayout.K_MAJOR)).a_layout is ALayout.K_MAJOR


def test_enumeration_is_kept_on_disk_and_rebuilt_when_unreadable(tmp_path, monkeypatch):
    from nmgen.config import ALayout
    from nmgen.space import Problem, _valid_configs, enumerate_configs, enumeration_cache

    monkeypatch.setenv("NMGEN_CACHE_DIR", str(tmp_path))
    problem = Problem(2, 4, 8, a_layout=ALayout.K_MAJOR)
    build = enumerate_configs.__wrapped__  # past the in-process cache
    fresh = build(problem)
    path = enumeration_cache(problem)
    assert path.is_relative_to(tmp_path) and path.exists()
    assert fresh == tuple(_valid_configs(problem))
    assert build(problem) == fresh  # read back
    path.write_bytes(b"not a pickle")
    assert build(problem) == fresh  # rebuilt, and written again
    assert build(problem) == fresh and path.read_bytes() != b"not a pickle"
    other = enumeration_cache(Problem(2, 4, 16, a_layout=ALayout.K_MAJOR))
    assert other != path
