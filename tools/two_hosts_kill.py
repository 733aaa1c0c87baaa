"""Two "hosts" on one machine: two tuning workers, each with its own GPU
(``CUDA_VISIBLE_DEVICES``), one PostgreSQL server for the tuned database and the Optuna
storage; one worker is killed (SIGKILL) mid-run and started again. Then every study must
hold exactly its trials, none running or waiting, and the database one row per problem
and configuration, with a winner for every problem.

    python tools/two_hosts_kill.py OUT.json URL SHAPES [PATTERN] [TRIALS] [KILL_AFTER] [dry]
    e.g. python tools/two_hosts_kill.py kill.json \\
             postgresql+psycopg://nmgen@127.0.0.1:54329/postgres shapes/llama20.txt 8:32 16 120

KILL_AFTER: the number of trial rows in the database at which worker 1 is killed;
``dry``: the workers' dry run (the model's estimates, no GPU).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402
from sqlalchemy import func, select  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from nmgen.store.database import connect  # noqa: E402
from nmgen.store.tables import ProblemRow, TrialRow  # noqa: E402

State = optuna.trial.TrialState


def start_worker(index: int, url: str, shapes: str, pattern: str, trials: int,
                 log: Path, dry: bool) -> subprocess.Popen:
    args = [sys.executable, "-m", "nmgen.cli", "tune", "--gpu", gpu_name(), "--shapes", shapes,
            "--pattern", pattern, "--vec", "32", "--trials", str(trials), "--db", url,
            "--storage", url, "--worker-index", str(index), "--worker-count", "2", "--quiet",
            *(["--dry-run", "--compile-top", "0"] if dry else [])]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(args, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT)


def gpu_name() -> str:
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.lower()
    except FileNotFoundError:  # no GPU: the dry run
        name = ""
    return "h200" if "h200" in name else "h100"


def trial_rows(engine) -> int:
    with Session(engine) as session:
        return session.scalar(select(func.count()).select_from(TrialRow)) or 0


def check(url: str, trials: int) -> dict:
    """Every study's trial states, and the database's rows, after the run."""
    studies = optuna.get_all_study_summaries(storage=url)
    states: Counter = Counter()
    short, by_worker = [], Counter()
    for summary in studies:
        study = optuna.load_study(study_name=summary.study_name, storage=url)
        these = Counter(t.state for t in study.get_trials(deepcopy=False))
        states.update(these)
        if these[State.COMPLETE] != trials or these[State.RUNNING] or these[State.WAITING]:
            short.append(summary.study_name)
        by_worker.update(t.user_attrs.get("worker", "?")  # host:pid
                         for t in study.get_trials(deepcopy=False, states=(State.COMPLETE,)))
    engine = connect(url)
    with Session(engine) as session:
        pairs = session.execute(select(TrialRow.problem_id, TrialRow.config_id, func.count())
                                .group_by(TrialRow.problem_id, TrialRow.config_id)).all()
        problems = session.scalar(select(func.count()).select_from(ProblemRow))
        with_ok = session.scalar(select(func.count(func.distinct(TrialRow.problem_id)))
                                 .where(TrialRow.status.in_(("ok", "model"))))
    engine.dispose()
    return {"studies": len(studies), "studies_not_exact": short,
            "complete": states[State.COMPLETE], "expected_complete": trials * len(studies),
            "failed": states[State.FAIL], "running": states[State.RUNNING],
            "waiting": states[State.WAITING],
            "db_rows": len(pairs), "db_rows_duplicated": sum(c > 1 for *_, c in pairs),
            "problems": problems, "problems_with_winner": with_ok,
            "complete_by_worker": dict(by_worker)}


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, url, shapes = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    pattern = sys.argv[4] if len(sys.argv) > 4 else "8:32"
    trials = int(sys.argv[5]) if len(sys.argv) > 5 else 16
    kill_after = int(sys.argv[6]) if len(sys.argv) > 6 else 120
    dry = sys.argv[7:8] == ["dry"]
    logs = [out.with_name(f"{out.stem}_worker{i}.log") for i in range(2)]
    engine = connect(url)  # tables made before the workers race to make them
    start = time.monotonic()
    workers = [start_worker(i, url, shapes, pattern, trials, logs[i], dry) for i in range(2)]
    while trial_rows(engine) < kill_after and all(w.poll() is None for w in workers):
        time.sleep(0.2)
    if workers[1].poll() is not None:
        sys.exit(f"worker 1 exited before the kill ({workers[1].returncode}): see {logs[1]}")
    killed_at = (trial_rows(engine), round(time.monotonic() - start, 1))
    workers[1].send_signal(signal.SIGKILL)
    workers[1].wait()
    workers[1] = start_worker(1, url, shapes, pattern, trials, logs[1], dry)  # the host comes back
    codes = [w.wait() for w in workers]
    result = {"pattern": pattern, "trials": trials, "shapes": shapes,
              "killed_at_rows": killed_at[0], "killed_at_s": killed_at[1],
              "wall_s": round(time.monotonic() - start, 1), "exit_codes": codes,
              **check(url, trials)}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    ok = (not result["studies_not_exact"] and result["complete"] == result["expected_complete"]
          and not result["db_rows_duplicated"] and codes == [0, 0]
          and result["problems_with_winner"] == result["problems"])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
