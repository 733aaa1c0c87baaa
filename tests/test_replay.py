"""A search replayed on a recorded table (no GPU): the real tuner runs, the numbers come
from the table, and the result compares its winner with the table's best."""

from __future__ import annotations

import dataclasses
import json
import zlib

import pytest

from nmgen.families.f32_simt import F32_SIMT
from nmgen.families.f32_simt.model import estimate
from nmgen.families.f32_simt.space import CORE_SPACE
from nmgen.gpus import gpu_spec
from nmgen.problem import ALayout
from nmgen.store.tables import TrialStatus
from nmgen.tune.replay import (
    MissingRecord,
    Record,
    exhaustive_best,
    read_tables,
    replay,
    search_space,
)
from nmgen.tune.seeds import model_seeds
from nmgen.tune.task import TuneTask

SHAPE = (512, 2048, 2048)
TASK = TuneTask.of(gpu_spec("h100"), F32_SIMT, 8, 32, 32, ALayout.K_MAJOR, SHAPE)


@pytest.fixture(scope="module")
def space():
    return search_space(TASK)


def recorded(space):
    """A stand-in for an exhaustive run: the model's time with a fixed +-10 % scatter per
    configuration, and every 50th configuration recorded as wrong."""
    table = {}
    for config in space:
        h = zlib.crc32(config.name.encode())
        if h % 50 == 0:
            table[config.name] = Record(TrialStatus.WRONG, None)
        else:
            ms = estimate(config, TASK.gpu, *SHAPE).time_ms * (0.9 + 0.2 * (h % 1000) / 1000)
            table[config.name] = Record(TrialStatus.OK, ms)
    return table


def test_space_is_the_tuners(space):
    names = [c.name for c in space]
    assert names == sorted(set(names))
    assert {c.split_k for c in space} == {1, 2, 4}
    assert set(model_seeds(TASK, 6)) <= set(space)


def test_replay_compares_the_winner_with_the_table_best(space, tmp_path):
    table = recorded(space)
    path = tmp_path / "slice0.jsonl"
    path.write_text("".join(json.dumps({"shape": list(SHAPE), "config": name,
                                        "status": rec.status, "ms": rec.ms}) + "\n"
                            for name, rec in table.items()))
    tables = read_tables([path])
    assert tables[SHAPE] == table
    results = list(replay([TASK], tables, trials=16, seeds=[0, 1]))
    assert [r.seed for r in results] == [0, 1]
    best_name, best_ms = exhaustive_best(table)
    for r in results:
        assert r.trials == 16 and r.space == len(space)
        assert (r.exhaustive_config, r.exhaustive_ms) == (best_name, best_ms)
        assert table[r.best_config].status == TrialStatus.OK
        assert r.best_ms == table[r.best_config].ms >= best_ms
        assert r.gap == pytest.approx(r.best_ms / best_ms - 1)


def test_a_table_missing_a_configuration_is_an_error(space):
    table = recorded(space)
    for seed in model_seeds(TASK, 6):
        del table[seed.name]
    with pytest.raises(MissingRecord, match="not in the exhaustive table"):
        list(replay([TASK], {SHAPE: table}, trials=8, seeds=[0]))


def test_a_smaller_space_bounds_the_whole_search(space, tmp_path):
    """With a smaller space the tuner asks only for its configurations, seeds included:
    a table of that space alone serves the whole replay."""
    task = dataclasses.replace(TASK, space=CORE_SPACE)
    small = search_space(task)
    assert 0 < len(small) < len(space) / 5
    assert set(small) <= set(space) and all(CORE_SPACE.contains(c) for c in small)
    assert set(model_seeds(task, 6)) <= set(small)
    table = {name: rec for name, rec in recorded(space).items()
             if name in {c.name for c in small}}
    results = list(replay([task], {SHAPE: table}, trials=24, seeds=[0]))
    assert results[0].space == len(small) and results[0].trials == 24
