"""The search space, declared once: the tuner's Optuna parameters, the enumeration, random
sampling and replay all derive from it and agree; the core benchmark's hand-picked
kernels; the enumeration's disk cache."""

from __future__ import annotations

import json
import random
from pathlib import Path

import optuna
import pytest

from nmgen.families.base import enumeration
from nmgen.families.f32_simt import F32_SIMT
from nmgen.families.f32_simt.space import CORE_BEST, CORE_SPACE, SPACE, core_config
from nmgen.families.space import ConfigError, Param, SearchSpace
from nmgen.gpus import GPUS, Arch, gpu_spec
from nmgen.problem import ALayout, Problem
from nmgen.tune.replay import search_space
from nmgen.tune.task import TuneTask
from nmgen.tune.tuner import suggest_config

CORE_RUN = Path(__file__).resolve().parent.parent / "results" / "core_tma_h100" / "bench_core.json"
SMALL = Problem(2, 4, 8, a_layout=ALayout.K_MAJOR)
PROBLEMS = [SMALL, Problem(8, 32, 32), Problem(16, 32, 32, arch=Arch.SM80),
            Problem(4, 8, 16, a_layout=ALayout.K_MAJOR, arch=Arch.SM90)]


def _task(problem: Problem, space: SearchSpace = SPACE) -> TuneTask:
    gpu = gpu_spec("h100") if problem.arch is Arch.SM90 else gpu_spec("a100")
    return TuneTask(gpu, F32_SIMT, problem, 256, 512, 512, space=space)


@pytest.mark.parametrize("problem", PROBLEMS, ids=str)
def test_optuna_parameters_are_the_declaration(problem):
    """A study asks for exactly the declared parameters, each within its declared values
    (narrowed only by what the problem allows), and a trial of an enumerated
    configuration's values builds that configuration."""
    task = _task(problem)
    choices = task.space.choices(problem)
    assert tuple(choices) == tuple(p.name for p in SPACE.params)
    for param in SPACE.params:
        assert choices[param.name] and set(choices[param.name]) <= set(param.choices)
    assert choices["a_tile"] == (("tk", "tm", "tr", "tx") if problem.a_layout is
                                 ALayout.ROW_MAJOR else ("tk",))
    assert choices["tma"] == ((False, True) if problem.arch is Arch.SM90 else (False,))
    for config in enumeration(F32_SIMT, problem, SPACE)[::97]:
        values = SPACE.values_of(config)
        assert all(values[name] in choices[name] for name in choices), config.name
        assert suggest_config(optuna.trial.FixedTrial(values), task) == config


@pytest.mark.parametrize("problem", PROBLEMS[:2], ids=str)
def test_enumeration_is_every_valid_point_of_the_declared_grid(problem):
    """The enumeration (with its early rejections) is exactly the valid configurations of
    the declared enumerated values, in the grid's order."""
    narrow = SPACE.narrowed(ms=(16, 32, 64), ns=(32, 64, 128), mt=(4, 8), nt=(4, 8))
    grid = [narrow.config(problem, values) for values in narrow.grid(problem)]
    assert tuple(narrow.enumerate(problem)) == tuple(c for c in grid if c is not None)
    assert all(c.split_k == 1 and not c.stream_k for c in narrow.enumerate(problem))


def test_a_parallel_enumeration_is_the_serial_one(monkeypatch):
    """Split over forked processes (the start of ``nmgen tune``), an enumeration holds
    the same configurations in the same order."""
    from nmgen.families import space as space_module

    problem = PROBLEMS[0]
    narrow = SPACE.narrowed(ms=(16, 32, 64), ns=(32, 64, 128), mt=(4, 8), nt=(4, 8))
    serial = tuple(narrow.enumerate(problem))
    monkeypatch.setattr(space_module, "PARALLEL_FROM", 1)
    with space_module.parallel_enumeration(3):
        assert tuple(narrow.enumerate(problem)) == serial
    assert space_module._processes == 1


def test_whole_enumeration_holds_only_valid_distinct_configs():
    configs = enumeration(F32_SIMT, Problem(16, 32, 32), SPACE)
    assert len(configs) > 1000
    assert len({c.name for c in configs}) == len(configs)
    assert all(c.smem_bytes <= c.arch.max_smem_per_block for c in configs)


@pytest.mark.parametrize("seed", range(5))
def test_samples_and_replay_stay_within_the_optuna_parameters(seed):
    rng = random.Random(seed)
    problem = rng.choice(PROBLEMS)
    choices = SPACE.choices(problem)
    for _ in range(50):
        config = SPACE.sample(problem, rng)
        values = SPACE.values_of(config)
        assert all(values[name] in choices[name] for name in choices)
        assert SPACE.config(problem, values) == config
    core_task = _task(SMALL, CORE_SPACE)
    replayable = search_space(core_task)
    assert replayable and all(CORE_SPACE.contains(c) for c in replayable)


def test_subspaces_narrow_the_declaration():
    assert all(CORE_SPACE.contains(c) for c in CORE_SPACE.enumerate(SMALL))
    assert not all(CORE_SPACE.contains(c) for c in enumeration(F32_SIMT, SMALL, SPACE))
    with pytest.raises(ValueError, match="no parameter"):
        SPACE.narrowed(tiles=(1,))


def test_a_declaration_cannot_enumerate_values_it_does_not_offer():
    with pytest.raises(ValueError, match="enumerated values outside"):
        Param("split_k", (1, 2), enumerated=(3,))
    with pytest.raises(ConfigError, match="no valid"):
        SPACE.narrowed(ms=(16,), mt=(16,), warp=("32x1",)).sample(SMALL, random.Random(0),
                                                                  max_tries=20)


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
    assert core_config(Problem(8, 32, 32, dtype="bf16")) is None


def test_enumeration_is_kept_on_disk_and_rebuilt_when_unreadable(tmp_path, monkeypatch):
    from nmgen.cache import cache_file

    monkeypatch.setenv("NMGEN_CACHE_DIR", str(tmp_path))
    build = enumeration.__wrapped__  # past the in-process cache
    fresh = build(F32_SIMT, SMALL, SPACE)
    path = cache_file("space", ("f32", SMALL, SPACE), F32_SIMT.source_files())
    assert path.is_relative_to(tmp_path) and path.exists()
    assert fresh == tuple(SPACE.enumerate(SMALL))
    assert build(F32_SIMT, SMALL, SPACE) == fresh  # read back
    path.write_bytes(b"not a pickle")
    assert build(F32_SIMT, SMALL, SPACE) == fresh  # rebuilt, and written again
    assert build(F32_SIMT, SMALL, SPACE) == fresh and path.read_bytes() != b"not a pickle"
    other = cache_file("space", ("f32", Problem(2, 4, 16, a_layout=ALayout.K_MAJOR), SPACE),
                       F32_SIMT.source_files())
    assert other != path


@pytest.mark.parametrize("family", __import__("nmgen").families.registry.all_families(),
                         ids=lambda f: f.name)
def test_every_family_declares_its_space_once(family):
    """For every registered family: a study's parameters are the declared ones, every
    enumerated configuration is reachable from them, and values round-trip."""
    from nmgen.bench.selftest import fuzz_arch

    dtype = sorted(family.dtypes, key=lambda d: d.value)[-1]
    arch = fuzz_arch(family, Arch.SM90)  # sm_90, else the newest it serves (mmasp: sm_89)
    problem = next(p for p in (Problem(4, 16, 16, arch=arch, dtype=dtype),  # the first it serves
                               Problem(4, 16, 64, ALayout.K_MAJOR, arch, dtype),
                               Problem(2, 4, 1, arch=arch, dtype=dtype))
                   if family.serves(p) is None)
    gpu = gpu_spec("h100") if arch is Arch.SM90 else next(
        g for g in GPUS.values() if g.arch is arch)
    task = TuneTask(gpu, family, problem, 64, 256, 512)
    choices = task.space.choices(problem)
    assert tuple(choices) == family.space.names
    configs = list(family.space.enumerate(problem))
    assert configs
    for config in configs[::max(1, len(configs) // 50)]:
        values = family.space.values_of(config)
        assert all(values[name] in choices[name] for name in choices)
        assert suggest_config(optuna.trial.FixedTrial(values), task) == config
