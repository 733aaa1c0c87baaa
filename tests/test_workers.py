"""Several tuning workers sharing studies: real worker processes (`nmgen tune --dry-run`,
the model standing in for the GPU), a real PostgreSQL server (started by `.ci/run`, URL in
NMGEN_TEST_POSTGRES) and a real SQLite file with a journal storage for `--devices`."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import optuna
import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.orm import Session

from nmgen.families.f32_simt import F32_SIMT
from nmgen.gpus import gpu_spec
from nmgen.problem import ALayout
from nmgen.store.database import connect
from nmgen.store.tables import ConfigRow, ProblemRow, TrialRow
from nmgen.tune import workers
from nmgen.tune.liveness import ask, fail_dead
from nmgen.tune.storage import default_storage_url, open_storage
from nmgen.tune.studies import give_back_waiting
from nmgen.tune.task import TuneTask
from nmgen.tune.tuner import Tuner
from nmgen.tune.workers import run_worker


def task_of(m: int) -> TuneTask:
    return TuneTask.of(gpu_spec("h100"), F32_SIMT, 2, 4, 16, ALayout.ROW_MAJOR, (m, 256, 512))

TRIALS = 10
PATTERN, VEC = "2:4", "16"
FAMILY = F32_SIMT.name  # one study a shape (other families serve some of these shapes too)
SHAPES = [(64, 256, 512), (17, 300, 200), (128, 512, 256), (33, 128, 384), (256, 256, 256),
          (8, 640, 128), (96, 192, 320), (1, 512, 512)]
FAST_HEARTBEAT = {"NMGEN_HEARTBEAT_S": "1", "NMGEN_HEARTBEAT_GRACE_S": "4"}


@pytest.fixture
def pg_url():
    """A fresh database on the test PostgreSQL server, dropped afterwards."""
    base = os.environ.get("NMGEN_TEST_POSTGRES")
    if not base:
        if os.environ.get("NMGEN_REQUIRE_POSTGRES") == "1":
            pytest.fail("NMGEN_REQUIRE_POSTGRES=1 but NMGEN_TEST_POSTGRES is not set")
        pytest.skip("no PostgreSQL server (NMGEN_TEST_POSTGRES)")
    name = f"nmgen_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    yield base.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as conn:
        conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
    admin.dispose()


@pytest.fixture
def shapes_file(tmp_path):
    path = tmp_path / "shapes.txt"
    path.write_text("".join(f"{m} {n} {k}\n" for m, n, k in SHAPES))
    return path


def worker(shapes, db, storage, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """``nmgen tune --dry-run`` on ``shapes``; ``storage`` None: the default one."""
    args = ["tune", "--gpu", "h100", "--shapes", str(shapes), "--pattern", PATTERN,
            "--vec", VEC, "--family", FAMILY, "--trials", str(TRIALS), "--dry-run",
            "--compile-top", "0", "--db", db, *(["--storage", storage] if storage else []), *extra]
    return subprocess.Popen([sys.executable, "-m", "nmgen.cli", *args],
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out + err


def check_consistent(db: str, storage: str, shapes: list = SHAPES) -> Counter:
    """Every study (one a shape of ``shapes``) has exactly TRIALS complete trials and
    nothing left running or waiting; the database holds one row per configuration a study
    measured, with the value the study was told. Returns the complete trials per worker."""
    store = open_storage(storage)
    studies = store.get_all_studies()
    assert len(studies) == len(shapes)
    engine = create_engine(db)
    by_worker: Counter = Counter()
    for summary in studies:
        study = optuna.load_study(study_name=summary.study_name, storage=store)
        trials = study.get_trials(deepcopy=False)
        states = Counter(t.state for t in trials)
        assert states[optuna.trial.TrialState.COMPLETE] == TRIALS, (summary.study_name, states)
        assert not states[optuna.trial.TrialState.RUNNING]
        assert not states[optuna.trial.TrialState.WAITING]
        rows_m, rows_n, rows_k = (int(x) for x in summary.study_name.rsplit("_", 1)[1]
                                  .split("x"))
        with Session(engine) as session:
            held = dict(session.execute(
                select(ConfigRow.name, TrialRow.time_ms).join(TrialRow.config_row)
                .join(TrialRow.problem).where(ProblemRow.rows == rows_m,
                                              ProblemRow.cols == rows_n,
                                              ProblemRow.depth == rows_k)).all())
        measured = {}
        for t in trials:
            if t.state == optuna.trial.TrialState.COMPLETE:
                by_worker[t.user_attrs["worker"]] += 1
                if t.user_attrs.get("status") == "model":
                    measured[t.user_attrs["config"]] = t.value
        assert measured == held, summary.study_name
    with Session(engine) as session:  # one row per (problem, configuration)
        pairs = session.execute(select(TrialRow.problem_id, TrialRow.config_id,
                                       func.count()).group_by(TrialRow.problem_id,
                                                              TrialRow.config_id)).all()
        assert pairs and all(count == 1 for *_, count in pairs)
    engine.dispose()
    return by_worker


def test_two_workers_share_studies_on_postgres(pg_url, shapes_file):
    procs = [worker(shapes_file, pg_url, pg_url, "--worker-index", str(i),
                    "--worker-count", "2") for i in range(2)]
    for proc in procs:
        finish(proc)
    by_worker = check_consistent(pg_url, pg_url)
    assert len(by_worker) == 2, by_worker  # both contributed
    assert sum(by_worker.values()) == TRIALS * len(SHAPES)


def test_two_workers_without_index_race_on_the_same_studies(pg_url, shapes_file):
    """Both start on the first study at once: trials asked beyond the plan are given back
    unmeasured, never counted."""
    procs = [worker(shapes_file, pg_url, pg_url) for _ in range(2)]
    for proc in procs:
        finish(proc)
    assert sum(check_consistent(pg_url, pg_url).values()) == TRIALS * len(SHAPES)


def test_killed_worker_loses_nothing_and_its_trial_is_redone(pg_url, shapes_file):
    # A worker that died mid-trial before the run: a running trial whose heartbeat stops.
    storage = open_storage(pg_url, heartbeat_s=1, grace_s=4)
    first = "model-" + task_of(SHAPES[0][0]).study_name
    assert task_of(SHAPES[0][0]).shape == SHAPES[0]
    study = optuna.create_study(study_name=first, storage=storage, direction="minimize")
    dead = study.ask()
    dead.set_user_attr("worker", "elsewhere:1")
    storage.record_heartbeat(dead._trial_id)
    # ... and one that died between asking and its first heartbeat.
    unbeaten = study.ask()

    procs = [worker(shapes_file, pg_url, pg_url, "--worker-index", str(i),
                    "--worker-count", "2", env=FAST_HEARTBEAT) for i in range(2)]
    engine = connect(pg_url)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # kill worker 0 a third of the way through
        with Session(engine) as session:
            if (session.scalar(select(func.count()).select_from(TrialRow)) or 0) >= 20:
                break
        time.sleep(0.05)
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    finish(procs[1])
    engine.dispose()
    by_worker = check_consistent(pg_url, pg_url)
    assert sum(by_worker.values()) == TRIALS * len(SHAPES)
    retried = [t for t in optuna.load_study(study_name=first, storage=pg_url).get_trials()
               if t.number in (dead.number, unbeaten.number)]
    assert len(retried) == 2
    assert all(t.state == optuna.trial.TrialState.FAIL for t in retried)  # heartbeat checks


def test_devices_run_workers_on_a_journal_beside_sqlite(tmp_path, shapes_file):
    db = f"sqlite:///{tmp_path / 'tuned.db'}"
    args = ["tune", "--gpu", "h100", "--shapes", str(shapes_file), "--pattern", PATTERN,
            "--vec", VEC, "--family", FAMILY, "--trials", str(TRIALS), "--dry-run",
            "--compile-top", "0", "--db", db, "--devices", "0,1"]
    result = subprocess.run([sys.executable, "-m", "nmgen.cli", *args], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 workers finished" in result.stdout
    journal = f"journal:{tmp_path / 'tuned.db'}.optuna-journal"
    by_worker = check_consistent(db, journal)
    assert len(by_worker) == 2, (by_worker, result.stderr[-3000:])
    assert sum(by_worker.values()) == TRIALS * len(SHAPES)


def test_devices_count_the_gpus_cuda_visible_devices_leaves(tmp_path, shapes_file):
    """--devices indices (and all) name GPUs as this process sees them: each worker gets
    the physical GPU, not index i of the whole host; bad or repeated indices are errors."""
    def run(devices: str) -> subprocess.CompletedProcess:
        db = f"sqlite:///{tmp_path / devices.replace(',', '_')}.db"
        args = ["tune", "--gpu", "h100", "--shapes", str(shapes_file), "--pattern", PATTERN,
                "--vec", VEC, "--family", FAMILY, "--trials", "2", "--dry-run",
                "--compile-top", "0", "--db", db, "--devices", devices]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "5,7"}
        return subprocess.run([sys.executable, "-m", "nmgen.cli", *args], capture_output=True,
                              text=True, timeout=300, env=env)

    for devices, expected in (("all", ("5", "7")), ("1", ("7",))):
        result = run(devices)
        assert result.returncode == 0, result.stderr[-3000:]
        for i, gpu in enumerate(expected):
            assert f"worker {i} on GPU {gpu}: pid" in result.stderr
        assert f"worker {len(expected)} on GPU" not in result.stderr
    result = run("0,2")
    assert result.returncode == 2
    assert "--devices 2: not an index of the 2 GPUs that CUDA_VISIBLE_DEVICES=5,7" in result.stderr
    result = run("1,1")
    assert result.returncode == 2 and "GPU 1 named twice" in result.stderr


def test_rdb_storage_on_sqlite_is_refused_for_several_workers(tmp_path, shapes_file):
    db = f"sqlite:///{tmp_path / 'tuned.db'}"
    args = ["tune", "--gpu", "h100", "--shapes", str(shapes_file), "--family", FAMILY,
            "--dry-run", "--db", db, "--storage", db, "--devices", "0,1"]
    result = subprocess.run([sys.executable, "-m", "nmgen.cli", *args], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert "not safe for 2 worker processes" in result.stderr
    assert "journal:PATH" in result.stderr


def test_fail_orphans_fails_and_requeues_a_dead_workers_trial(tmp_path):
    from nmgen.tune.liveness import fail_orphans

    storage = open_storage(f"journal:{tmp_path / 'journal'}")
    study = optuna.create_study(study_name="s", storage=storage)
    alive, dead = study.ask(), study.ask()
    for trial, owner in ((alive, "host:1"), (dead, "host:2")):
        trial.suggest_int("x", 0, 9)
        trial.set_user_attr("worker", owner)
    assert fail_orphans(storage, "host:2") == 1
    trials = {t.number: t for t in study.get_trials()}
    assert trials[alive.number].state == optuna.trial.TrialState.RUNNING
    assert trials[dead.number].state == optuna.trial.TrialState.FAIL
    retry = [t for t in trials.values() if t.state == optuna.trial.TrialState.WAITING]
    assert len(retry) == 1 and retry[0].params == trials[dead.number].params


def test_devices_worker_killed_the_other_finishes(tmp_path, shapes_file):
    db = f"sqlite:///{tmp_path / 'tuned.db'}"
    args = ["tune", "--gpu", "h100", "--shapes", str(shapes_file), "--pattern", PATTERN,
            "--vec", VEC, "--family", FAMILY, "--trials", str(TRIALS), "--dry-run",
            "--compile-top", "0", "--db", db, "--devices", "0,1"]
    proc = subprocess.Popen([sys.executable, "-m", "nmgen.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = None
    for line in proc.stderr:  # "nmgen tune: worker 1 on GPU 1: pid N"
        if "worker 1 on GPU 1: pid" in line:
            pid = int(line.rsplit(" ", 1)[1])
        if pid and line.startswith("[worker 1]") and "trials" in line:
            os.kill(pid, signal.SIGKILL)  # after its first study, while it works on more
            break
    out, err = proc.communicate(timeout=300)
    assert pid is not None
    assert proc.returncode == 1, err[-3000:]  # a worker died: said, and the exit code says so
    assert f"(pid {pid}) exited with -9" in err
    by_worker = check_consistent(db, f"journal:{tmp_path / 'tuned.db'}.optuna-journal")
    assert sum(by_worker.values()) == TRIALS * len(SHAPES)


APPENDER = """
import sys
from nmgen.tune.storage import JournalFile
journal = JournalFile(sys.argv[1])
for i in range(int(sys.argv[3])):
    journal.append_logs([{"writer": sys.argv[2], "i": i, "pad": "x" * 5000}])
"""


def test_journal_file_keeps_every_record_of_processes_writing_at_once(tmp_path):
    """Three processes append large records at once: every record is read back whole,
    each writer's in its order."""
    from nmgen.tune.storage import JournalFile

    path = str(tmp_path / "journal")
    JournalFile(path)  # made before the writers race to make it
    writers = [subprocess.Popen([sys.executable, "-c", APPENDER, path, str(w), "300"])
               for w in range(3)]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0]
    logs = list(JournalFile(path).read_logs(0))
    assert Counter(log["writer"] for log in logs) == {"0": 300, "1": 300, "2": 300}
    for w in "012":
        assert [log["i"] for log in logs if log["writer"] == w] == list(range(300))


HOLDER = """
import sys, time
from nmgen.tune.storage import JournalFlock
lock = JournalFlock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(1.5)
lock.release()
"""


def test_journal_flock_makes_another_process_wait(tmp_path):
    from nmgen.tune.storage import JournalFlock

    path = str(tmp_path / "journal")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "held"
    lock = JournalFlock(path)
    start = time.monotonic()
    lock.acquire()
    waited = time.monotonic() - start
    lock.release()
    assert holder.wait(timeout=30) == 0
    assert waited > 1.0, f"acquired after {waited:.2f} s while another process held the lock"


def test_journal_file_keeps_every_record_of_threads_writing_at_once(tmp_path):
    """Threads of one process share one JournalFile (and its lock) without losing a
    record or deadlocking."""
    import threading

    from nmgen.tune.storage import JournalFile

    journal = JournalFile(str(tmp_path / "journal"))

    def write(w: int) -> None:
        for i in range(200):
            journal.append_logs([{"writer": w, "i": i}])

    threads = [threading.Thread(target=write, args=(w,), daemon=True) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not any(t.is_alive() for t in threads), "a writer is stuck"
    logs = list(journal.read_logs(0))
    assert Counter(log["writer"] for log in logs) == {0: 200, 1: 200, 2: 200, 3: 200}


def test_journal_storage_uses_the_unsynced_file_with_its_flock(tmp_path):
    from nmgen.tune.storage import JournalFile, JournalFlock

    backend = open_storage(f"journal:{tmp_path / 'journal'}")._backend
    assert isinstance(backend, JournalFile) and isinstance(backend._lock, JournalFlock)


def test_held_journal_writes_a_trials_records_in_one_append(tmp_path, monkeypatch):
    """A trial's parameters and its result, held, reach the journal in one append each,
    read back whole by a second storage; a block that raises still appends what it held;
    creating a trial inside a block is written (and read back) at once."""
    from nmgen.tune.storage import JournalFile, writes_held

    appends: list[int] = []
    real_append = JournalFile.append_logs
    monkeypatch.setattr(JournalFile, "append_logs",
                        lambda self, logs: appends.append(len(logs)) or real_append(self, logs))
    url = f"journal:{tmp_path / 'journal'}"
    study = optuna.create_study(study_name="s", storage=open_storage(url))
    trial = study.ask()
    appends.clear()
    with writes_held(study._storage) as flush:
        values = [trial.suggest_categorical(f"p{i}", [1, 2, 3]) for i in range(5)]
        trial.set_user_attr("config", "c")
        study.tell(trial, 1.0)
        assert appends == []
        flush()
        assert appends == [7]
    other = optuna.load_study(study_name="s", storage=open_storage(url))
    (done,) = other.get_trials()
    assert done.state == optuna.trial.TrialState.COMPLETE and done.value == 1.0
    assert done.params == {f"p{i}": v for i, v in enumerate(values)}
    assert done.user_attrs == {"config": "c"}
    appends.clear()
    with pytest.raises(RuntimeError), writes_held(study._storage):
        study.ask().suggest_categorical("p0", [1, 2, 3])  # the new trial: written at once
        raise RuntimeError("a failed measurement")
    assert appends == [1, 1]
    assert len(other.get_trials()[1].params) == 1


def test_default_storage_is_a_journal_beside_sqlite_and_the_server_otherwise():
    assert default_storage_url("sqlite:////x/tuned.db") == "journal:/x/tuned.db.optuna-journal"
    url = "postgresql+psycopg://nmgen@127.0.0.1:54329/nmgen"
    assert default_storage_url(url) == url


def test_under_a_budget_every_study_gets_its_first_batch_before_any_its_second(tmp_path):
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    storage = open_storage(f"journal:{tmp_path / 'studies.journal'}")
    tuner = Tuner(connect(url), storage, trials=16, batch=8, dry_run=True, log=lambda s: None)
    tasks = [task_of(m)
             for m in (32, 64, 128, 256)]
    report = run_worker(tuner, tasks, time_budget_s=600.0, log=lambda s: None)
    assert report.complete == len(tasks)
    starts = {}
    for task in tasks:
        study = optuna.load_study(study_name=tuner.study_name(task), storage=storage)
        trials = sorted(study.trials, key=lambda t: t.number)
        assert len(trials) == 16
        starts[task.rows] = (trials[0].datetime_start, trials[8].datetime_start)
    assert max(first for first, _ in starts.values()) < min(second for _, second in starts.values())


@pytest.mark.parametrize("in_flight", [1, 2])
def test_a_worker_keeps_in_flight_studies_going_at_once(tmp_path, in_flight):
    """With two studies at once, the second starts before the first is done (its batches
    are measured while the other's compile); each still gets exactly its trials."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    storage = open_storage(f"journal:{tmp_path / 'studies.journal'}")
    tuner = Tuner(connect(url), storage, trials=24, batch=8, dry_run=True,
                  in_flight=in_flight, log=lambda s: None)
    tasks = [task_of(m)
             for m in (32, 64, 128, 256)]
    report = run_worker(tuner, tasks, log=lambda s: None)
    assert report.complete == report.studies == len(tasks)
    spans = []
    for task in tasks:
        study = optuna.load_study(study_name=tuner.study_name(task), storage=storage)
        done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        assert len(done) == len(study.trials) == 24
        spans.append((min(t.datetime_start for t in done),
                      max(t.datetime_complete for t in done)))
    overlaps = [spans[i + 1][0] < spans[i][1] for i in range(len(spans) - 1)]
    assert overlaps == [in_flight > 1] * (len(tasks) - 1), spans


@pytest.mark.parametrize("in_flight", [1, 3])
def test_a_study_left_alone_gets_its_batches_side_by_side(tmp_path, in_flight):
    """With nothing else open, a worker asks a study it has under way for more batches at
    once (up to its studies at once); the study still gets exactly its trials."""
    storage = open_storage(f"journal:{tmp_path / 'studies.journal'}")
    tuner = Tuner(connect(f"sqlite:///{tmp_path / 'tuned.db'}"), storage, trials=24, batch=8,
                  dry_run=True, in_flight=in_flight, log=lambda s: None)
    task = task_of(64)
    report = run_worker(tuner, [task], log=lambda s: None)
    assert report.complete == 1
    study = optuna.load_study(study_name=tuner.study_name(task), storage=storage)
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 24
    # the third batch is asked before the first is told when three may go at once
    assert (trials[16].datetime_start < trials[0].datetime_complete) == (in_flight == 3)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_study_is_confirmed_once_by_the_last_worker_out(tmp_path, monkeypatch, workers):
    """Batches of one study side by side (three in one worker, or two workers): its
    finalists are timed again by the batch that ends last, once, having seen every
    record of the problem; a batch that ends while another runs leaves it."""
    from concurrent.futures import ThreadPoolExecutor

    from nmgen.store.records import trials_of
    from nmgen.tune.tuner import CONFIRMED_ATTR

    confirmed: Counter = Counter()
    real_confirm = Tuner.confirm
    monkeypatch.setattr(Tuner, "confirm", lambda self, task, measurer, rows=None: (
        confirmed.update([task.study_name]) or real_confirm(self, task, measurer, rows)))
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    journal = f"journal:{tmp_path / 'studies.journal'}"
    task = task_of(64)
    tuners = [Tuner(connect(url), open_storage(journal), trials=32, batch=8, dry_run=True,
                    in_flight=3, log=lambda s: None) for _ in range(workers)]
    with ThreadPoolExecutor(workers) as pool:
        reports = list(pool.map(lambda i: run_worker(tuners[i], [task], index=i,
                                                     count=workers, log=lambda s: None),
                                range(workers)))
    assert all(r.complete == 1 for r in reports)
    study = optuna.load_study(study_name=tuners[0].study_name(task),
                              storage=open_storage(journal))
    records = trials_of(tuners[0].engine, tuners[0].problem_key(task))
    assert study.user_attrs[CONFIRMED_ATTR] == len(records) > 0
    if workers == 1:  # one thread: its batches end one after the other
        assert confirmed[task.study_name] == 1
    else:
        assert 1 <= confirmed[task.study_name] <= 2  # two ending at once may both


def test_seeds_left_waiting_in_a_full_study_are_given_back():
    """A seed enqueued once a study already had its trials is failed unmeasured (marked
    surplus); in a study still short of trials it stays for the next ask."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    for x in (1.0, 2.0):
        study.enqueue_trial({"x": x})
        trial = study.ask()
        study.tell(trial, trial.suggest_float("x", 0, 10))
    study.enqueue_trial({"x": 3.0})
    assert give_back_waiting(study, trials=3) == 0  # short of trials: it is still wanted
    assert give_back_waiting(study, trials=2) == 1
    (late,) = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.FAIL]
    assert late.user_attrs["surplus"] is True
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))


def test_two_workers_rank_each_studys_seeds_once(tmp_path, monkeypatch):
    """Two workers opening the same new studies at once (each with its own storage, as two
    processes have): the one that creates a study ranks its seeds and stores them in it,
    the other waits for them. Each study's seeds are ranked once and enqueued once, and
    they are its first trials."""
    from concurrent.futures import ThreadPoolExecutor

    from nmgen.tune import seeds as seeds_module
    from nmgen.tune.studies import stored_seeds

    ranked: Counter = Counter()
    real_model_seeds = seeds_module.model_seeds
    monkeypatch.setattr(seeds_module, "model_seeds", lambda task, count: (
        ranked.update([task.study_name]) or real_model_seeds(task, count)))
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    journal = f"journal:{tmp_path / 'studies.journal'}"
    tasks = [task_of(m) for m in (32, 64, 128, 256)]
    tuners = [Tuner(connect(url), open_storage(journal), trials=16, batch=8, dry_run=True,
                    seed=i, log=lambda s: None) for i in range(2)]
    with ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(lambda i: run_worker(tuners[i], tasks, index=i, count=2,
                                                     log=lambda s: None), range(2)))
    assert all(r.complete == len(tasks) for r in reports)
    assert sum(r.studies for r in reports) > len(tasks)  # studies both workers worked on
    assert ranked == Counter(t.study_name for t in tasks)
    storage = open_storage(journal)
    for task in tasks:
        study = optuna.load_study(study_name=tuners[0].study_name(task), storage=storage)
        trials = sorted(study.trials, key=lambda t: t.number)
        enqueued = [t.user_attrs["config"] for t in trials if "fixed_params" in t.system_attrs]
        names = stored_seeds(study)
        assert names and enqueued == names
        assert [t.user_attrs["config"] for t in trials[:len(names)]] == names


def test_a_worker_begins_untouched_studies_before_it_joins_another_workers(tmp_path):
    """A study another worker has begun comes after every untouched one, wherever it is
    in the walk; once none is untouched, the walk joins it."""
    from nmgen.tune.workers import _walk

    storage = open_storage(f"journal:{tmp_path / 'studies.journal'}")
    tuner = Tuner(connect(f"sqlite:///{tmp_path / 'tuned.db'}"), storage, trials=8, batch=8,
                  dry_run=True, log=lambda s: None)
    tasks = [task_of(m) for m in (32, 64, 128)]
    other = optuna.create_study(study_name=tuner.study_name(tasks[0]), storage=storage)
    other.ask()  # begun elsewhere
    walk = _walk(tuner, tasks, math.inf, time.monotonic(), lambda: set())
    assert [next(walk)[0] for _ in range(3)] == [tasks[1], tasks[2], tasks[0]]


def test_walk_order_pairs_start_at_both_ends_of_their_share():
    from nmgen.tune.workers import walk_order

    tasks = list(range(20))  # stands for TuneTasks: the order only moves them
    assert walk_order(tasks, 0, 1) == tasks
    assert walk_order(tasks, 0, 2) == tasks
    assert walk_order(tasks, 1, 2) == tasks[::-1]  # meets worker 0 in the middle
    orders = [walk_order(tasks, i, 4) for i in range(4)]
    assert all(sorted(o) == tasks for o in orders)  # every worker may reach every study
    assert [o[0] for o in orders] == [0, 9, 10, 19]  # two pairs, each from both ends
    assert orders[1][:10] == list(range(9, -1, -1)) and orders[2][:10] == list(range(10, 20))
    three = [walk_order(tasks, i, 3)[0] for i in range(3)]
    assert len(set(three)) == 3 and three[0] == 0


# ------------------------------------------------- a killed worker's trials are redone
def finish_within(proc: subprocess.Popen, timeout: float) -> str:
    """``finish``, but a worker still running after ``timeout`` s (waiting for ever on a
    dead worker's trials) is killed and the test fails, showing what it said."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"still running after {timeout:.0f} s; it said:\n{err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    return out + err


def kill_while_running(proc: subprocess.Popen, storage_url: str, timeout: float = 120) -> int:
    """Kill ``proc`` (-9) at a moment it has running trials, once some trial is complete:
    stopped, looked at through the storage, then killed or let go on for a moment.
    Every running trial then names its worker (none is between being asked and named),
    so that what the test sees does not hang on the grace period. Returns how many of
    its trials it left running."""
    me = f"{socket.gethostname()}:{proc.pid}"
    store = open_storage(storage_url)

    def running_and_complete() -> tuple[list[str | None], int]:
        owners, complete = [], 0
        for summary in store.get_all_studies():
            study = optuna.load_study(study_name=summary.study_name, storage=store)
            for trial in study.get_trials(deepcopy=False):
                if trial.state == optuna.trial.TrialState.RUNNING:
                    owners.append(trial.user_attrs.get("worker"))
                complete += trial.state == optuna.trial.TrialState.COMPLETE
        return owners, complete

    deadline = time.monotonic() + timeout
    while running_and_complete()[1] == 0:  # its tables and first studies are made
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
        time.sleep(0.05)
    while True:
        assert proc.poll() is None, "it finished before it could be killed"
        assert time.monotonic() < deadline, "never caught with named running trials"
        proc.send_signal(signal.SIGSTOP)
        looked = time.monotonic()
        owners, _ = running_and_complete()
        if me in owners and None not in owners:
            proc.kill()
            proc.wait()
            return owners.count(me)
        proc.send_signal(signal.SIGCONT)
        time.sleep(max(0.02, time.monotonic() - looked))  # it runs at least half the time


def test_rerun_after_kill_resumes_on_the_journal_beside_sqlite(tmp_path, shapes_file):
    """`nmgen tune` killed (-9) with trials running, then run again (the default storage:
    a journal beside the SQLite database, which has no heartbeats): the re-run fails the
    dead process's running trials, redoes them and finishes every study, instead of
    waiting for them for ever."""
    db = f"sqlite:///{tmp_path / 'tuned.db'}"
    journal = default_storage_url(db)
    left = kill_while_running(worker(shapes_file, db, None), journal)
    assert left > 0
    said = finish_within(worker(shapes_file, db, None, env=FAST_HEARTBEAT), timeout=90)
    assert "failed and enqueued again" in said, said[-3000:]
    by_worker = check_consistent(db, journal)  # each configuration once a problem
    assert sum(by_worker.values()) == TRIALS * len(SHAPES)


def test_rerun_after_kill_resumes_on_postgres(pg_url, tmp_path):
    """The same with the database and the studies on PostgreSQL (three shapes: it is
    slower). Heartbeats alone would fail the dead process's trials only after their grace
    period (ten minutes here): the re-run sees at once that the process that named itself
    on them is gone."""
    shapes = SHAPES[:3]
    shapes_file = tmp_path / "shapes.txt"
    shapes_file.write_text("".join(f"{m} {n} {k}\n" for m, n, k in shapes))
    left = kill_while_running(worker(shapes_file, pg_url, pg_url), pg_url)
    assert left > 0
    slow_heartbeats = {"NMGEN_HEARTBEAT_S": "1", "NMGEN_HEARTBEAT_GRACE_S": "600"}
    said = finish_within(worker(shapes_file, pg_url, pg_url, env=slow_heartbeats), timeout=90)
    assert "failed and enqueued again" in said, said[-3000:]
    by_worker = check_consistent(pg_url, pg_url, shapes)
    assert sum(by_worker.values()) == TRIALS * len(shapes)


def test_hand_started_worker_killed_the_survivor_finishes(tmp_path, shapes_file):
    """Two workers started by hand on one journal (no supervisor to clean up after a
    dead one); one is killed with trials running: the other redoes them and finishes."""
    db = f"sqlite:///{tmp_path / 'tuned.db'}"
    journal = f"journal:{tmp_path / 'studies.journal'}"
    procs = [worker(shapes_file, db, journal, "--worker-index", str(i), "--worker-count", "2",
                    env=FAST_HEARTBEAT) for i in range(2)]
    try:
        left = kill_while_running(procs[0], journal)
    finally:
        if procs[0].poll() is None:
            procs[0].kill()
        procs[0].communicate()
    assert left > 0
    said = finish_within(procs[1], timeout=90)
    assert f"{socket.gethostname()}:{procs[0].pid} ({left}) failed and enqueued again" in said
    by_worker = check_consistent(db, journal)
    assert sum(by_worker.values()) == TRIALS * len(SHAPES)


def test_fail_dead_fails_the_trials_of_dead_workers_only(tmp_path):
    """Dead: a process of this host that is gone or a zombie, this pid in an earlier
    process, a trial never named once older than the grace period. Alive, or unknown:
    a live process, this process's own trial, another host's worker."""
    host = socket.gethostname()
    storage = open_storage(f"journal:{tmp_path / 'journal'}")
    study = optuna.create_study(study_name="s", storage=storage)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    zombie.kill()  # not reaped yet
    stat = Path(f"/proc/{zombie.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    owners = {"gone": f"{host}:{gone.pid}", "zombie": f"{host}:{zombie.pid}",
              "earlier": f"{host}:{os.getpid()}", "live": f"{host}:{os.getppid()}",
              "elsewhere": f"elsewhere.example:{gone.pid}", "mine": f"{host}:{os.getpid()}",
              "unnamed": None}
    trials = {}
    for role, name in owners.items():
        trial = ask(study) if role == "mine" else study.ask()
        trial.suggest_int("x", 0, 9)
        if name is not None:
            trial.set_user_attr("worker", name)
        trials[role] = trial.number
    failed, running = fail_dead(study, grace_s=3600)
    zombie.wait()
    assert sorted(t.number for t in failed) == sorted(trials[r] for r in
                                                      ("gone", "zombie", "earlier"))
    assert sorted(t.number for t in running) == sorted(
        trials[r] for r in ("live", "elsewhere", "mine", "unnamed"))
    retries = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert len(retries) == 3 and all("worker" not in t.user_attrs for t in retries)
    assert fail_dead(study, grace_s=3600)[0] == []  # failed once, retried once
    failed, _ = fail_dead(study, grace_s=0)
    assert [t.number for t in failed] == [trials["unnamed"]]


def test_a_waiting_worker_says_whose_trials_it_waits_for(tmp_path):
    """A worker with nothing left to ask but another (live) worker's running trial says so
    at once, then no more than every WAIT_LOG_S; once that trial ends it finishes."""
    storage = open_storage(f"journal:{tmp_path / 'studies.journal'}")
    said: list[str] = []
    tuner = Tuner(connect(f"sqlite:///{tmp_path / 'tuned.db'}"), storage, trials=8, batch=8,
                  dry_run=True, log=lambda s: None)
    task = task_of(64)
    other = optuna.create_study(study_name=tuner.study_name(task), direction="minimize",
                                storage=open_storage(f"journal:{tmp_path / 'studies.journal'}"))
    held = other.ask()  # a live worker's: the parent of this process
    held.set_user_attr("worker", f"{socket.gethostname()}:{os.getppid()}")
    reports = []
    thread = threading.Thread(target=lambda: reports.append(
        run_worker(tuner, [task], log=said.append)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not any(s.startswith("waiting for") for s in said):
        assert time.monotonic() < deadline and thread.is_alive(), said
        time.sleep(0.05)
    time.sleep(3 * workers.POLL_S)
    waits = [s for s in said if s.startswith("waiting for")]
    assert waits == [f"waiting for 1 running trial of 1 study, worker {socket.gethostname()}:"
                     f"{os.getppid()} (1); 0 s so far"]
    other.tell(held, state=optuna.trial.TrialState.FAIL)
    thread.join(timeout=60)
    assert not thread.is_alive() and reports[0].complete == 1
    done = other.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(done) == 8


def test_cross_check_share_gives_every_problem_to_one_worker():
    """Once every study is complete, the workers split the cross-check: each problem is
    checked by exactly one of them, in contiguous runs of about equal cost (a fixed part
    and M·N·K), so that a run of large shapes is shorter."""
    from types import SimpleNamespace

    from nmgen.tune.workers import cross_check_share

    small = [SimpleNamespace(shape=(256, 2048, 2048)) for _ in range(8)]
    large = [SimpleNamespace(shape=(4096, 8192, 8192)) for _ in range(4)]
    for tasks in (small, small + large, large + small[:3]):
        for count in (1, 2, 3, 4):
            shares = [cross_check_share(tasks, i, count) for i in range(count)]
            assert [t for share in shares for t in share] == tasks  # contiguous, in order
            mean = sum(math.prod(t.shape) for t in tasks) / len(tasks)
            weight = {id(t): 1 + math.prod(t.shape) / mean for t in tasks}
            cost = [sum(weight[id(t)] for t in share) for share in shares]
            assert max(cost) - min(cost) <= 2 * max(weight.values())  # whole problems
    halves = [cross_check_share(small + large, i, 2) for i in range(2)]
    assert len(halves[0]) == 9 and len(halves[1]) == 3  # the large shapes cost more
    assert cross_check_share(small, 1, 2) == small[4:]


def test_cross_check_order_takes_the_other_shares_from_their_ends():
    from types import SimpleNamespace

    from nmgen.tune.workers import cross_check_order, cross_check_share

    tasks = [SimpleNamespace(shape=(256 * (i % 4 + 1), 2048, 2048)) for i in range(12)]
    for count in (1, 2, 3, 4):
        for index in range(count):
            order = cross_check_order(tasks, index, count)
            own = cross_check_share(tasks, index, count)
            assert order[:len(own)] == own and sorted(map(id, order)) == sorted(map(id, tasks))
            if count > 1:  # then the last problem of the next worker's share
                assert order[len(own)] is cross_check_share(tasks, (index + 1) % count,
                                                             count)[-1]


def test_workers_cross_check_each_problem_once_whoever_finishes_first(tmp_path, monkeypatch):
    """Two workers cross-checking at once, one of them starting late: each problem is
    checked once, by the worker that claimed it; the early one takes the late one's
    share from its end. Claims name the pass: a later pass (more trials) checks anew."""
    from concurrent.futures import ThreadPoolExecutor

    from nmgen.tune.workers import (
        _cross_check,
        _cross_check_claims,
        cross_check_order,
        cross_check_share,
    )

    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    journal = f"journal:{tmp_path / 'studies.journal'}"
    tuners = [Tuner(connect(url), open_storage(journal), trials=8, batch=8, dry_run=True,
                    log=lambda s: None) for _ in range(2)]
    tasks = [task_of(m) for m in (32, 48, 64, 96, 128, 192, 256, 512)]
    assert run_worker(tuners[0], tasks, log=lambda s: None).complete == len(tasks)
    checked: list[tuple[int, int]] = []
    real_cross_check = Tuner.cross_check

    def cross_check(self, task, winners=None):
        checked.append((tuners.index(self), task.rows))
        time.sleep(0.1 if self is tuners[0] else 0.4)  # the second: slower
        return real_cross_check(self, task, winners)

    monkeypatch.setattr(Tuner, "cross_check", cross_check)

    def check(i: int) -> None:
        time.sleep(0.3 * i)  # the second starts late
        claims = _cross_check_claims(tuners[i], tasks)
        _cross_check(tuners[i], cross_check_order(tasks, i, 2), lambda s: None, claims)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(check, range(2)))
    assert sorted(rows for _, rows in checked) == sorted(t.rows for t in tasks)
    by = Counter(i for i, _ in checked)
    assert by[0] > len(cross_check_share(tasks, 0, 2)) and by[1] >= 1  # 0 took some of 1's
    checked.clear()
    tuners[0].trials = 16
    assert run_worker(tuners[0], tasks, log=lambda s: None).complete == len(tasks)
    _cross_check(tuners[0], tasks, lambda s: None, _cross_check_claims(tuners[0], tasks))
    assert len(checked) == len(tasks)


def test_a_workers_cross_check_reads_every_winner_once(tmp_path, monkeypatch):
    """Once every study is complete, a worker cross-checks its problems with one read of
    every shape's winners (three a problem before), then each problem's winner alone;
    every problem ends with its winner, as a fresh read has it."""
    from nmgen.policy import best_per_problem
    from nmgen.store.tables import TrialStatus
    from nmgen.tune import tuner as tuner_module
    from nmgen.tune.measurers import ModelMeasurer
    from nmgen.tune.workers import _cross_check

    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    storage = open_storage(f"journal:{tmp_path / 'studies.journal'}")
    tuner = Tuner(connect(url), storage, trials=8, batch=8, dry_run=True, log=lambda s: None)
    tasks = [task_of(m) for m in (32, 64, 128, 256, 512)]
    assert run_worker(tuner, tasks, log=lambda s: None).complete == len(tasks)
    whole, alone = [], []
    real_times = tuner_module.shape_times
    monkeypatch.setattr(tuner_module, "best_per_problem",
                        lambda *a, **k: whole.append(a[1]) or best_per_problem(*a, **k))
    monkeypatch.setattr(tuner_module, "shape_times", lambda *a, only_shape=False, **k: (
        alone.append(only_shape) or real_times(*a, only_shape=only_shape, **k)))
    _cross_check(tuner, tasks, lambda s: None)
    assert len(whole) == 1 and alone == [True] * len(tasks)
    winners = best_per_problem(tuner.engine, ModelMeasurer(tasks[0]).key, TrialStatus.MODEL)
    assert sorted(winners) == sorted(t.shape for t in tasks)
    assert all(tuner.winner_of(ModelMeasurer(t).key) == winners[t.shape] for t in tasks)
