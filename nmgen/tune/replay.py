"""A search replayed on recorded measurements (Kernel Tuner's "simulation mode").

An exhaustive run (``tools/exhaustive.py measure``, on the GPU) times every configuration
of the tuner's space on a few shapes. Replaying then runs the real ``Tuner`` (its seeds,
its Optuna study, its bookkeeping) with a measurer that looks each configuration up in
that table instead of launching it, so the search is judged against the exhaustive best
on the very same numbers, for as many seeds and trial budgets as wanted, without a GPU.
"""

from __future__ import annotations

import gzip
import itertools
import json
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..families.base import Config
from ..shapes import Shape
from ..store.database import connect
from ..store.tables import GOOD, TrialStatus
from .measurers import INFEASIBLE_MS, Measurer, Outcome
from .storage import open_storage
from .task import TuneTask
from .tuner import Tuner


@dataclass(frozen=True)
class Record:
    """One configuration on one shape, as the exhaustive run measured it."""

    status: str  # a TrialStatus
    ms: float | None


Table = dict[str, Record]  # configuration name -> its record on one shape


def search_space(task: TuneTask) -> list[Config]:
    """Every feasible configuration the tuner can ask for on ``task`` (its whole grid
    through the same rules), in name order."""
    found: dict[str, Config] = {}
    for values in task.space.grid(task.problem, enumerated=False):
        config = task.space.config(task.problem, values)
        if config is not None and task.family.feasible(config, task.gpu) is None:
            found[config.name] = config
    return [found[name] for name in sorted(found)]


def read_tables(paths: Iterable[Path]) -> dict[Shape, Table]:
    """The exhaustive run's JSON-lines files (one line a configuration and shape; gzipped
    where the name ends in .gz)."""
    tables: dict[Shape, Table] = {}
    for path in map(Path, paths):
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode()
        for line in text.splitlines():
            rec = json.loads(line)
            tables.setdefault(tuple(rec["shape"]), {})[rec["config"]] = Record(
                rec["status"], rec["ms"])
    return tables


class MissingRecord(KeyError):
    """The search asked for a configuration the exhaustive table lacks."""


class ReplayMeasurer(Measurer):
    """Looks configurations up in ``table`` (nothing to compile); recorded under a GPU row
    of its own."""

    def __init__(self, task: TuneTask, table: Table, device: str):
        self.key = task.key(f"replay:{device}", 0)
        self._table = table

    def measure(self, config: Config, model_ms: float) -> Outcome:
        record = self._table.get(config.name)
        if record is None:
            raise MissingRecord(f"{config.name} is not in the exhaustive table: the table "
                                "must cover the tuner's whole space")
        if record.status in GOOD:
            return record.status, record.ms, None
        return record.status, INFEASIBLE_MS, "recorded as " + record.status

    def retime(self, configs: list[Config], rounds: int, repeat: int
               ) -> dict[str, float]:
        """A table holds one time a configuration: timing again reads it again."""
        return {c.name: self._table[c.name].ms for c in configs}


@dataclass
class ReplayTuner(Tuner):
    tables: dict[Shape, Table] | None = None
    device: str = "recorded"

    def measurer(self, task: TuneTask) -> ReplayMeasurer:
        return ReplayMeasurer(task, self.tables[(task.rows, task.cols, task.depth)],
                              self.device)


@dataclass(frozen=True)
class ReplayResult:
    shape: Shape
    seed: int
    trials: int
    space: int  # configurations in the exhaustive table (its trials)
    best_ms: float  # the search's winner
    exhaustive_ms: float  # the table's best
    best_config: str
    exhaustive_config: str

    @property
    def gap(self) -> float:
        """How much slower the search's winner is than the exhaustive best (0.02 = 2 %)."""
        return self.best_ms / self.exhaustive_ms - 1.0

    @property
    def trial_share(self) -> float:
        return self.trials / self.space


def exhaustive_best(table: Table) -> tuple[str, float]:
    ok = [(rec.ms, name) for name, rec in table.items() if rec.status == TrialStatus.OK]
    if not ok:
        raise ValueError("the table holds no correct configuration")
    ms, name = min(ok)
    return name, ms


def replay(tasks: Iterable[TuneTask], tables: dict[Shape, Table], trials: int,
           seeds: Iterable[int], device: str = "recorded",
           tuner_class: type[ReplayTuner] = ReplayTuner) -> Iterator[ReplayResult]:
    """Run the tuner (``tuner_class``) on every task once per seed, each time in a fresh
    database."""
    for task, seed in itertools.product(list(tasks), list(seeds)):
        shape = (task.rows, task.cols, task.depth)
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'replay.db'}"
            storage = open_storage(f"journal:{Path(tmp) / 'studies.journal'}")
            tuner = tuner_class(connect(url), storage, trials=trials, seed=seed,
                                tables=tables, device=device, log=lambda s: None)
            report = tuner.tune(task)
        best_name, best_ms = exhaustive_best(tables[shape])
        yield ReplayResult(shape, seed, report.trials, len(tables[shape]), report.winner.time_ms,
                           best_ms, report.winner.config.name, best_name)
