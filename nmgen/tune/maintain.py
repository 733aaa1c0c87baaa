"""Keeping a tuned database current without a new search: re-keying records across a
generator change (``carry``), timing again the kernels a change altered, the reference
kernels a database lacks, and the families' refinements of tuned winners."""

from __future__ import annotations

import sqlite3
import sys
from collections import Counter
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..families.registry import all_families, by_generator, config_from_name
from ..gpus import check_device, gpu_spec
from ..progress import Progress
from ..store.database import database_url, default_url
from ..store.records import ProblemKey
from ..store.tables import ConfigRow, ProblemRow, TrialRow
from .measurers import GpuMeasurer, ModelMeasurer
from .task import TuneTask
from .tuner import Tuner


def time_references(engine, lacking: dict, dry_run: bool, plan: bool,
                    quiet: bool = False) -> None:
    """Time the reference kernel of the problems ``lacking`` it (``plan``: count them)."""
    verb = "would be timed" if plan else "timed"
    print(f"reference kernel {verb} on {len(lacking)} problems whose records lack it",
          flush=True)
    if lacking and not plan:
        remeasure(engine, lacking, dry_run, quiet)


def lacking_references(engine, patterns: set[tuple[int, int]] | None
                       ) -> dict[ProblemKey, list]:
    """Problems of a current family whose records hold no result of the family's
    reference kernel, which no tuned shape may fall below: a carry drops it where the
    generator changed it and it was not among a problem's fastest."""
    current = {f.generator_hash() for f in all_families()}
    lacking = {}
    with Session(engine) as session:
        held = {(pid, name) for pid, name in session.execute(
            select(TrialRow.problem_id, ConfigRow.name).join(TrialRow.config_row))}
        for row in session.scalars(select(ProblemRow).where(
                ProblemRow.template_hash.in_(current))):
            if patterns is not None and (row.n, row.m) not in patterns:
                continue
            try:
                key = ProblemKey.of_row(row)
            except ValueError:  # an arch, layout or dtype this nmgen does not know
                continue
            reference = by_generator(key.template_hash).reference_config(key.problem)
            if reference is None or (row.id, reference.name) in held:
                continue
            lacking[key] = [reference]
    return lacking


def print_plan(report, top: int) -> None:
    """What ``carry --plan`` found: the changed kernels by pattern and the remeasure."""
    patterns = Counter(f"{c.n}:{c.m}" for c in map(config_from_name, report.changed))
    print("changed kernels by pattern: " + (", ".join(
        f"{p} {count}" for p, count in sorted(patterns.items())) or "none"))
    kernels = [c for configs in report.remeasure.values() for c in configs]
    print(f"--remeasure {top} would time {len(kernels)} kernels "
          f"({len({c.name for c in kernels})} distinct) of {len(report.remeasure)} "
          "problems; nothing was written")


def scratch_copy(url: str | None, folder: Path) -> str:
    """A copy of the SQLite database at ``url`` in ``folder`` (``carry --plan``)."""
    url = database_url(url) if url else default_url()
    if not url.startswith("sqlite:///"):
        raise ValueError(f"carry --plan works on an SQLite file, not {url}")
    copy = folder / "plan.sqlite"
    # SQLite's backup, not a file copy: it includes what the write-ahead log still holds.
    with sqlite3.connect(url.removeprefix("sqlite:///")) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    return f"sqlite:///{copy}"


def is_present(spec) -> bool:
    """Whether the GPU present is the table entry ``spec``."""
    from ..runtime.device import device_info

    info = device_info()
    try:
        check_device(spec, info.name, info.sms, info.major, info.minor)
    except ValueError:
        return False
    return True


def task_of(key: ProblemKey) -> TuneTask | None:
    """The tuning task of a stored problem of a current family (else ``None``)."""
    family = by_generator(key.template_hash)
    if family is None:
        return None
    return TuneTask(gpu_spec(key.gpu), family, key.problem, *key.shape)


def remeasure(engine, problems: dict, dry_run: bool, quiet: bool = False) -> None:
    """Time again, on this GPU, each problem's given configurations (``carry
    --remeasure``, references, refinements); problems of another GPU or CUDA version are
    left for a machine that has them."""
    tuner = Tuner(engine, storage=None, dry_run=dry_run,
                  log=lambda s: print(s, file=sys.stderr, flush=True))
    skipped = 0
    try:
        with Progress(len(problems), "problems", quiet) as bar:
            for i, (key, configs) in enumerate(problems.items(), 1):
                bar.advance()
                task = task_of(key)
                if task is None or not (dry_run or is_present(task.gpu)):
                    skipped += 1
                    continue
                here = ModelMeasurer(task).key if dry_run else GpuMeasurer.key_of(task)
                if here.without_shape() != key.without_shape():
                    skipped += 1
                    continue
                winner = tuner.remeasure(task, configs)
                best = f"{winner.time_ms:.4f} ms {winner.config.name}" if winner else "none"
                print(f"[{i}/{len(problems)}] {task.study_name}: {len(configs)} remeasured, "
                      f"best {best}", flush=True)
    finally:
        tuner.close()
    if skipped:
        print(f"{skipped} problems of another GPU or CUDA version were not remeasured here")
