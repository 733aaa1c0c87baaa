"""Carrying tuned records across a generator change, on a real SQLite file and a real
older generator (a copy of this one whose split-K reduction reads differently)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nmgen
from nmgen.families.f32_simt import F32_SIMT
from nmgen.families.f32_simt.space import core_config
from nmgen.policy import best_per_problem
from nmgen.problem import Problem
from nmgen.store.database import connect
from nmgen.store.records import DeviceKey, ProblemKey, record_trial, trials_of
from nmgen.store.tables import TrialStatus
from nmgen.tune.carry import carry, render_hashes

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = Path("nmgen/families/f32_simt/templates/nm_spmm_f32.cu.j2")


def template_hash() -> str:
    return F32_SIMT.generator_hash()


def old_generator(tree: Path) -> str:
    return render_hashes(tree, [])[0]["f32"]
UNSPLIT = nmgen.KernelConfig(8, 32, 32, 64, 128, 64, 8, 8, a_layout="km")
SPLIT = UNSPLIT.replace(split_k=2)
CORE_8_32_KM = core_config(Problem(8, 32, 32, nmgen.ALayout.K_MAJOR))


def carry_cli(*args: str) -> subprocess.CompletedProcess:
    """`nmgen carry ARGS` in a process of its own, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "nmgen.cli", "carry", *args],
                          capture_output=True, text=True)


def key(generator: str) -> ProblemKey:
    return ProblemKey.of(Problem(8, 32, 32, "km"), (256, 4096, 4096),
                         DeviceKey("h100", "NVIDIA H100 80GB HBM3", 13000, 132), generator)


@pytest.fixture(scope="module")
def older_tree(tmp_path_factory) -> Path:
    """This generator with one comment of the split-K reduction kernel worded otherwise:
    split-K kernels' source differs, every other kernel's is the same."""
    root = tmp_path_factory.mktemp("older")
    shutil.copytree(ROOT / "nmgen", root / "nmgen")
    template = root / TEMPLATE
    text = template.read_text()
    assert "// Split-K reduction:" in text
    template.write_text(text.replace("// Split-K reduction:", "// Split-K sum:"))
    return root


def test_old_generator_renders_in_its_own_tree(older_tree):
    generators, sources = render_hashes(older_tree, [UNSPLIT.to_dict(), SPLIT.to_dict()])
    assert "f32" in generators and generators["f32"] != template_hash()
    assert sources[UNSPLIT.name] == nmgen.render(UNSPLIT).sha256
    assert sources[SPLIT.name] != nmgen.render(SPLIT).sha256


def test_carry_keeps_unchanged_kernels_and_drops_the_rest(older_tree, tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'tuned.db'}")
    old = old_generator(older_tree)
    record_trial(engine, key(old), UNSPLIT, old, TrialStatus.OK, time_ms=2.0, model_ms=1.9)
    record_trial(engine, key(old), SPLIT, old, TrialStatus.OK, time_ms=1.0, model_ms=1.2)
    report = carry(engine, older_tree)
    assert (report.problems, report.carried, report.dropped) == (1, 1, 1)
    assert report.changed == {SPLIT.name}
    assert trials_of(engine, key(old)) == []  # the older generator's problem is gone
    (row,) = trials_of(engine, key(template_hash()))
    assert (row.config_row.name, row.time_ms, row.model_ms) == (UNSPLIT.name, 2.0, 1.9)
    assert row.config_row.source_hash == nmgen.render(UNSPLIT).sha256
    assert best_per_problem(engine, key(template_hash()))[(256, 4096, 4096)].config == UNSPLIT
    assert carry(engine, older_tree).problems == 0  # nothing left to carry


def test_carry_of_some_patterns_leaves_the_rest_for_later(older_tree, tmp_path):
    """`carry --pattern 8:32` carries that pattern's problems; the 16:32 one keeps its
    older generator until a later carry from the same tree."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    old = old_generator(older_tree)
    other = key(old).at(dataclasses.replace(key(old).problem, n=16), key(old).shape)
    record_trial(connect(url), key(old), UNSPLIT, old, TrialStatus.OK, time_ms=2.0)
    record_trial(connect(url), other, UNSPLIT.replace(n=16), old, TrialStatus.OK, time_ms=3.0)

    done = carry_cli("--tree", str(older_tree), "--db", url, "--pattern", "8:32")
    assert done.returncode == 0, done.stderr
    assert "1 problems of an older generator: 1 trials carried" in done.stdout
    assert [r.time_ms for r in trials_of(connect(url), other)] == [3.0]
    assert [r.time_ms for r in trials_of(connect(url), key(template_hash()))] == [2.0]
    report = carry(connect(url), older_tree)
    assert (report.problems, report.carried) == (1, 1)
    assert trials_of(connect(url), other) == []


def test_carry_refuses_records_of_another_generator(older_tree, tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'tuned.db'}")
    record_trial(engine, key("x" * 64), UNSPLIT, "x" * 64, TrialStatus.OK, time_ms=1.0)
    with pytest.raises(ValueError, match="generator"):
        carry(engine, older_tree)


def test_carry_from_the_command_line(older_tree, tmp_path):
    """`nmgen carry --tree DIR`, as a user runs it; a tree of the same generator as the
    records is an error that names both."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    old = old_generator(older_tree)
    record_trial(connect(url), key(old), UNSPLIT, old, TrialStatus.OK, time_ms=2.0)

    done = carry_cli("--tree", str(older_tree), "--db", url)
    assert done.returncode == 0, done.stderr
    assert "1 problems of an older generator: 1 trials carried" in done.stdout
    record_trial(connect(url), key(old), SPLIT, old, TrialStatus.OK, time_ms=1.0)
    wrong = carry_cli("--tree", str(ROOT), "--db", url)  # the current generator made none of them
    assert wrong.returncode == 2 and "generator" in wrong.stderr


def model_key(generator: str, rows: int = 256) -> ProblemKey:
    """A dry run's problem (the model's estimates under a GPU row of their own)."""
    return ProblemKey.of(Problem(8, 32, 32, "km"), (rows, 4096, 4096),
                         DeviceKey("h100", "model:h100", 0, 132), generator)


def test_carry_lists_changed_finalists_and_remeasure_times_them(older_tree, tmp_path):
    """`carry(top=...)` names the changed kernels among a problem's fastest; the tuner's
    `remeasure` records them under the current generator (the model's estimate in a dry
    run) and the problem has its winner again."""
    from nmgen.gpus import gpu_spec
    from nmgen.tune.task import TuneTask
    from nmgen.tune.tuner import Tuner

    engine = connect(f"sqlite:///{tmp_path / 'tuned.db'}")
    old = old_generator(older_tree)
    record_trial(engine, model_key(old), UNSPLIT, old, TrialStatus.MODEL, time_ms=2.0)
    record_trial(engine, model_key(old), SPLIT, old, TrialStatus.MODEL, time_ms=1.0)
    record_trial(engine, model_key(old, rows=512), UNSPLIT, old, TrialStatus.MODEL,
                 time_ms=3.0)
    report = carry(engine, older_tree, top=2)
    new = model_key(template_hash())
    assert report.remeasure == {new: [SPLIT]}  # 512 rows: its one kernel was carried
    assert [r.config_row.name for r in trials_of(engine, new)] == [UNSPLIT.name]
    task = TuneTask.of(gpu_spec("h100"), F32_SIMT, 8, 32, 32, nmgen.ALayout.K_MAJOR,
                       (256, 4096, 4096))
    winner = Tuner(engine, storage=None, dry_run=True).remeasure(task, report.remeasure[new])
    rows = {r.config_row.name: r for r in trials_of(engine, new)}
    assert set(rows) == {UNSPLIT.name, SPLIT.name}
    assert rows[SPLIT.name].status == TrialStatus.MODEL
    assert rows[SPLIT.name].config_row.source_hash == nmgen.render(SPLIT).sha256
    assert winner is not None and winner.config.name == min(
        rows, key=lambda name: (rows[name].time_ms, name))


def test_carry_remeasure_from_the_command_line(older_tree, tmp_path):
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    old = old_generator(older_tree)
    record_trial(connect(url), model_key(old), SPLIT, old, TrialStatus.MODEL, time_ms=1.0)
    done = carry_cli("--tree", str(older_tree), "--db", url, "--remeasure", "3", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "0 trials carried" in done.stdout and "1 dropped" in done.stdout
    assert "[1/1] nmgen_h100_f32_f32_8:32_l32_km_256x4096x4096: 1 remeasured, best" in done.stdout
    # the carry left the problem without its reference kernel: that is timed too
    assert "reference kernel timed on 1 problems whose records lack it" in done.stdout
    rows = {r.config_row.name: r.status
            for r in trials_of(connect(url), model_key(template_hash()))}
    assert rows == {SPLIT.name: TrialStatus.MODEL, CORE_8_32_KM.name: TrialStatus.MODEL}


def test_reference_times_fills_in_the_reference_kernel(tmp_path):
    """`nmgen reference-times` times the reference kernel where a problem's records lack
    it, once: a second run finds nothing to do; --plan only counts."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    generator = template_hash()
    record_trial(connect(url), model_key(generator), UNSPLIT, generator, TrialStatus.MODEL,
                 time_ms=1.0)
    record_trial(connect(url), model_key(generator, rows=512), CORE_8_32_KM, generator,
                 TrialStatus.MODEL, time_ms=2.0)

    def core_times(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "nmgen.cli", "reference-times", "--db",
                               url, *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "would be timed on 1 problems" in core_times("--plan")
    assert len(trials_of(connect(url), model_key(generator))) == 1
    assert "would be timed on 0 problems" in core_times("--plan", "--pattern", "16:32")
    out = core_times("--dry-run")
    assert "timed on 1 problems" in out and "[1/1] nmgen_h100_f32_f32_8:32_l32_km_256x" in out
    names = {r.config_row.name for r in trials_of(connect(url), model_key(generator))}
    assert names == {UNSPLIT.name, CORE_8_32_KM.name}
    assert "timed on 0 problems" in core_times("--dry-run")


@pytest.mark.gpu
def test_carry_remeasure_on_the_gpu(older_tree, tmp_path):
    """`nmgen carry --remeasure` on the device: the changed kernel is checked and timed
    under the current generator, and the finalists are timed again in turns (the old
    records' made-up 50 and 99 ms do not survive)."""
    from nmgen.gpus import gpu_of_device_name, gpu_spec
    from nmgen.runtime.device import device_info

    info = device_info()
    spec = gpu_spec(gpu_of_device_name(info.name))

    def gpu_key(generator: str) -> ProblemKey:
        return ProblemKey.of(Problem(8, 32, 32, "km", spec.arch), (100, 512, 1024),
                             DeviceKey(spec.name, info.name, info.cuda_version, spec.sms),
                             generator)

    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    old = old_generator(older_tree)
    record_trial(connect(url), gpu_key(old), UNSPLIT, old, TrialStatus.OK, time_ms=50.0)
    record_trial(connect(url), gpu_key(old), SPLIT, old, TrialStatus.OK, time_ms=99.0)
    done = carry_cli("--tree", str(older_tree), "--db", url, "--remeasure", "2")
    assert done.returncode == 0, done.stderr
    assert "1 remeasured" in done.stdout
    assert "reference kernel timed on 1 problems" in done.stdout
    rows = {r.config_row.name: r for r in trials_of(connect(url), gpu_key(template_hash()))}
    assert set(rows) == {UNSPLIT.name, SPLIT.name, CORE_8_32_KM.name}
    for name in (SPLIT.name, CORE_8_32_KM.name):
        assert rows[name].status == TrialStatus.OK, rows[name].error
        assert 0 < rows[name].time_ms < 10
    assert rows[SPLIT.name].config_row.source_hash == nmgen.render(SPLIT).sha256
    assert 0 < rows[UNSPLIT.name].time_ms < 10
    winner = best_per_problem(connect(url), gpu_key(template_hash()))[(100, 512, 1024)]
    assert winner.config.name in rows


def test_carry_plan_writes_nothing(older_tree, tmp_path):
    """`nmgen carry --plan --remeasure TOP` says what a carry would do on a copy."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    old = old_generator(older_tree)
    record_trial(connect(url), key(old), UNSPLIT, old, TrialStatus.OK, time_ms=2.0)
    record_trial(connect(url), key(old), SPLIT, old, TrialStatus.OK, time_ms=1.0)
    done = carry_cli("--tree", str(older_tree), "--db", url, "--remeasure", "3", "--plan")
    assert done.returncode == 0, done.stderr
    assert "1 trials carried" in done.stdout and "1 dropped" in done.stdout
    assert "changed kernels by pattern: 8:32 1" in done.stdout
    assert "would time 1 kernels (1 distinct) of 1 problems; nothing was written" in done.stdout
    assert "reference kernel would be timed on 1 problems whose records lack it" in done.stdout
    assert len(trials_of(connect(url), key(old))) == 2  # the database as it was
    assert trials_of(connect(url), key(template_hash())) == []
