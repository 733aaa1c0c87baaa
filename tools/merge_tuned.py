"""Put the problems of freshly tuned databases into another one (the shipped
``nmgen/tuned_db/``, say): each problem they hold replaces the same problem there (same GPU,
CUDA version, template hash, pattern, L, layout and shape), trials and all; problems they
do not hold stay as they are. With ``--add``, their trials of kernels the problem has no
trial of join the problem's trials there instead, so that each problem's winner is the
fastest of both searches (a new search in a larger space that found a slower kernel on
some shapes, say); a kernel timed in both keeps its time there.

With ``--keep N``, each problem of the database then keeps only its N fastest correct
trials and its family's reference kernel (what dispatch, the nearest-shape seeds and the
finalists read), so that a shipped database stays small as families are added.

    python tools/merge_tuned.py [--add] [--keep N] INTO_URL [FROM_URL ...]
    e.g. python tools/merge_tuned.py sqlite:///nmgen/tuned_db/tuned.sqlite sqlite:///t832.db
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from sqlalchemy import delete, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, joinedload

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.families.registry import config_from_dict  # noqa: E402
from nmgen.policy import reference_name  # noqa: E402
from nmgen.store.database import connect  # noqa: E402
from nmgen.store.records import ProblemKey, config_row, problem_row  # noqa: E402
from nmgen.store.tables import GOOD, ConfigRow, ProblemRow, TrialRow  # noqa: E402


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
                    cfg = config_row(dst, config_from_dict(row.config_row.params),
                                     row.config_row.source_hash)
                    if cfg.id in timed:
                        continue
                    copied += 1
                    dst.add(TrialRow(problem_id=problem.id, config_id=cfg.id,
                                     status=row.status, time_ms=row.time_ms,
                                     tflops=row.tflops, model_ms=row.model_ms,
                                     error=row.error, created=row.created))
    return len(by_problem), copied


def keep_fastest(engine: Engine, keep: int) -> tuple[int, int]:
    """Each problem's ``keep`` fastest correct trials and its reference kernel's; the
    rest and the configurations no trial uses any more are deleted. Returns (trials
    before, after)."""
    with Session(engine) as session, session.begin():
        before = session.query(TrialRow).count()
        for problem in session.scalars(select(ProblemRow)):
            reference = reference_name(ProblemKey.of_row(problem))
            trials = session.scalars(select(TrialRow).where(
                TrialRow.problem_id == problem.id)).all()
            good = sorted((t for t in trials if t.status in GOOD),
                          key=lambda t: (t.time_ms, t.config_row.name))
            kept = {t.id for t in good[:keep]}
            kept |= {t.id for t in good if t.config_row.name == reference}
            for trial in trials:
                if trial.id not in kept:
                    session.delete(trial)
        session.flush()
        used = select(TrialRow.config_id)
        session.execute(delete(ConfigRow).where(ConfigRow.id.not_in(used)))
        after = session.query(TrialRow).count()
    return before, after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("into", help="SQLAlchemy URL of the database merged into")
    parser.add_argument("sources", nargs="*", help="URLs of the databases merged")
    parser.add_argument("--add", action="store_true",
                        help="add the sources' trials of kernels a problem lacks")
    parser.add_argument("--keep", type=int, metavar="N",
                        help="then keep each problem's N fastest trials and its reference")
    args = parser.parse_args()
    into = connect(args.into)
    for url in args.sources:
        problems, trials = merge(into, connect(url), args.add)
        print(f"{url}: {problems} problems ({trials} trials) "
              f"{'added to' if args.add else 'replaced in'} {args.into}")
    if args.keep is not None:
        before, after = keep_fastest(into, args.keep)
        print(f"kept {after} of {before} trials ({args.keep} fastest a problem and its "
              "reference kernel)")
        if into.url.get_backend_name() == "sqlite":
            with into.connect() as conn:
                conn.exec_driver_sql("VACUUM")


if __name__ == "__main__":
    main()
