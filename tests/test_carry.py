"""Carrying tuned records across a generator change, on a real SQLite file and a real
older generator (a copy of this one whose split-K reduction reads differently)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nmgen
from nmgen.carry import carry, render_hashes
from nmgen.db import ProblemKey, TrialStatus, best_per_problem, connect, record_trial, trials_of
from nmgen.dispatch import template_hash

ROOT = Path(__file__).resolve().parent.parent
UNSPLIT = nmgen.KernelConfig(8, 32, 32, 64, 128, 64, 8, 8, a_layout="km")
SPLIT = UNSPLIT.replace(split_k=2)


def key(generator: str) -> ProblemKey:
    return ProblemKey(gpu="h100", device_name="NVIDIA H100 80GB HBM3", arch="sm_90",
                      cuda_version=13000, sms=132, template_hash=generator, n=8, m=32, vec=32,
                      dtype="f32", a_layout="km", rows=256, cols=4096, depth=4096)


@pytest.fixture(scope="module")
def older_tree(tmp_path_factory) -> Path:
    """This generator with one comment of the split-K reduction kernel worded otherwise:
    split-K kernels' source differs, every other kernel's is the same."""
    root = tmp_path_factory.mktemp("older")
    shutil.copytree(ROOT / "nmgen", root / "nmgen")
    shutil.copytree(ROOT / "templates", root / "templates")
    template = root / "templates" / "nm_spmm_f32.cu.j2"
    text = template.read_text()
    assert "// Split-K reduction:" in text
    template.write_text(text.replace("// Split-K reduction:", "// Split-K sum:"))
    return root


def test_old_generator_renders_in_its_own_tree(older_tree):
    generator, sources = render_hashes(older_tree, [UNSPLIT.to_dict(), SPLIT.to_dict()])
    assert generator != template_hash()
    assert sources[UNSPLIT.name] == nmgen.render(UNSPLIT).sha256
    assert sources[SPLIT.name] != nmgen.render(SPLIT).sha256


def test_carry_keeps_unchanged_kernels_and_drops_the_rest(older_tree, tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'tuned.db'}")
    old, _ = render_hashes(older_tree, [])
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


def test_carry_refuses_records_of_another_generator(older_tree, tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'tuned.db'}")
    record_trial(engine, key("x" * 64), UNSPLIT, "x" * 64, TrialStatus.OK, time_ms=1.0)
    with pytest.raises(ValueError, match="generator"):
        carry(engine, older_tree)


def test_carry_from_the_command_line(older_tree, tmp_path):
    """`nmgen carry --tree DIR`, as a user runs it; a tree of the same generator as the
    records is an error that names both."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    old, _ = render_hashes(older_tree, [])
    record_trial(connect(url), key(old), UNSPLIT, old, TrialStatus.OK, time_ms=2.0)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "nmgen.cli", "carry", *args],
                              capture_output=True, text=True)

    done = cli("--tree", str(older_tree), "--db", url)
    assert done.returncode == 0, done.stderr
    assert "1 problems of an older generator: 1 trials carried" in done.stdout
    record_trial(connect(url), key(old), SPLIT, old, TrialStatus.OK, time_ms=1.0)
    wrong = cli("--tree", str(ROOT), "--db", url)  # the current generator made none of them
    assert wrong.returncode == 2 and "generator" in wrong.stderr
