"""Put the problems of freshly tuned databases into another one (the shipped
``tuned_db/``, say): each problem they hold replaces the same problem there (same GPU,
CUDA version, template hash, pattern, L, layout and shape), trials and all; problems they
do not hold stay as they are. With ``--add``, their trials of kernels the problem has no
trial of join the problem's trials there instead, so that each problem's winner is the
fastest of both searches (a new search in a larger space that found a slower kernel on
some shapes, say); a kernel timed in both keeps its time there.

    python tools/merge_tuned.py [--add] INTO_URL FROM_URL [FROM_URL ...]
    e.g. python tools/merge_tuned.py sqlite:///tuned_db/tuned.sqlite sqlite:///t832.db
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from sqlalchemy import delete, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, joinedload

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.db import ProblemKey, TrialRow, config_row, connect, problem_row  # noqa: E402


def merge(into: Engine, source: Engine, add: bool = False) -> tuple[int, int]:
    """Replace ``into``'s problems by ``source``'s (``add``: add ``source``'s trials of
    kernels they have no trial of); returns (problems, trials) copied."""
    with Session(source) as src:
        trials = src.scalars(select(TrialRow).options(
            joinedload(TrialRow.problem), joinedload(TrialRow.config_row))).unique().all()
        by_problem = defaultdict(list)
        for trial in trials:
            by_problem[ProblemKey.of_row(trial.problem)].append(trial)
        copied = 0
        with Session(into) as dst, dst.begin():
            for key, rows in by_problem.items():
                problem = problem_row(dst, key)
                if not add:
                    dst.execute(delete(TrialRow).where(TrialRow.problem_id == problem.id))
                timed = set(dst.scalars(select(TrialRow.config_id)
                                        .where(TrialRow.problem_id == problem.id)))
                for row in rows:
                    cfg = config_row(dst, row.config_row.config, row.config_row.source_hash)
                    if cfg.id in timed:
                        continue
                    copied += 1
                    dst.add(TrialRow(problem_id=problem.id, config_id=cfg.id,
                                     status=row.status, time_ms=row.time_ms,
                                     tflops=row.tflops, model_ms=row.model_ms,
                                     error=row.error, created=row.created))
    return len(by_problem), copied


def main() -> None:
    args = sys.argv[1:]
    add = "--add" in args
    into_url, *sources = [a for a in args if a != "--add"] or [""]
    if not sources:
        sys.exit(__doc__)
    into = connect(into_url)
    for url in sources:
        problems, trials = merge(into, connect(url), add)
        print(f"{url}: {problems} problems ({trials} trials) "
              f"{'added to' if add else 'replaced in'} {into_url}")


if __name__ == "__main__":
    main()
