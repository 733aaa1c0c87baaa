"""`nmgen refine`: a family's refinements of tuned problems' fastest kernels (the FP32
family's stream-K twins, gemv's wide sum), chosen by the model and timed beside the
finalists, on a real SQLite file (a dry run: the model's estimates stand in for the GPU's
times)."""

from __future__ import annotations

import subprocess
import sys

import nmgen
from nmgen.families.f32_simt import F32_SIMT
from nmgen.problem import Problem
from nmgen.store.database import connect
from nmgen.store.records import DeviceKey, ProblemKey, record_trial, trials_of
from nmgen.store.tables import TrialStatus
from nmgen.tune.refine import refinement_candidates


def template_hash() -> str:
    return F32_SIMT.generator_hash()

# 1024x6656x6656 on 64x128 tiles is 6.3 waves of 132 SMs; 4224x4096x4096 on 128x256 tiles
# is 4 whole waves, where stream-K has nothing to share out.
PARTIAL = nmgen.KernelConfig(16, 32, 32, 64, 128, 128, 8, 8, stages=1, a_layout="km")
WHOLE = nmgen.KernelConfig(16, 32, 32, 128, 256, 64, 16, 8, a_layout="km")


def key(rows: int, cols: int, depth: int) -> ProblemKey:
    return ProblemKey.of(Problem(16, 32, 32, "km"), (rows, cols, depth),
                         DeviceKey("h100", "model:h100", 0, 132), template_hash())


def test_twin_folds_split_and_slices_back():
    assert F32_SIMT.refinements(PARTIAL.replace(split_k=2)) == [PARTIAL.replace(stream_k=True)]
    assert F32_SIMT.refinements(PARTIAL.replace(ns=64, slice_k=2))[0].slice_k == 1
    assert F32_SIMT.refinements(PARTIAL.replace(stream_k=True)) == []


def test_candidates_where_the_model_expects_a_gain(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'tuned.db'}")
    generator = template_hash()
    record_trial(engine, key(1024, 6656, 6656), PARTIAL, generator, TrialStatus.MODEL, 1.0)
    record_trial(engine, key(4224, 4096, 4096), WHOLE, generator, TrialStatus.MODEL, 1.0)
    found = refinement_candidates(engine)
    assert found == {key(1024, 6656, 6656): [PARTIAL.replace(stream_k=True)]}
    assert refinement_candidates(engine, patterns={(8, 32)}) == {}


def test_refine_from_the_command_line(tmp_path):
    """--plan counts, a dry run records the twin, a second run finds nothing to do."""
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    record_trial(connect(url), key(1024, 6656, 6656), PARTIAL, template_hash(),
                 TrialStatus.MODEL, 1.0)

    def stream_k(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "nmgen.cli", "refine", "--db", url,
                               *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "would be timed on 1 problems (1 distinct kernels)" in stream_k("--plan")
    assert len(trials_of(connect(url), key(1024, 6656, 6656))) == 1
    out = stream_k("--dry-run")
    assert "[1/1] nmgen_h100_f32_f32_16:32_l32_km_1024x6656x6656: 1 remeasured" in out
    rows = {r.config_row.name: r.status for r in trials_of(connect(url), key(1024, 6656, 6656))}
    assert rows == {PARTIAL.name: TrialStatus.MODEL,
                    PARTIAL.replace(stream_k=True).name: TrialStatus.MODEL}
    assert "timed on 0 problems" in stream_k("--dry-run")


def test_stream_k_grid_shares_out_the_last_two_waves():
    from nmgen.families.f32_simt.launch import stream_k_grid

    assert stream_k_grid(512, 32, 132) == (132, 264)  # 3.9 waves: 2 whole, the rest shared
    assert stream_k_grid(528, 32, 132) == (132, 396)  # 4 whole waves: the last is shared
    assert stream_k_grid(100, 32, 132) == (132, 0)  # under a wave: all shared
    assert stream_k_grid(2, 3, 132) == (6, 0)  # at most one block a stage


def test_gemv_wide_sums_are_proposed_for_one_family_at_no_expected_loss(tmp_path):
    """The model does not tell the wide sum from its twin: proposed at --min-gain 0, for
    split-K winners only, and --family keeps the FP32 family's twins out."""

    from nmgen.families.gemv import GEMV
    from nmgen.families.gemv.config import GemvConfig

    engine = connect(f"sqlite:///{tmp_path / 'tuned.db'}")
    record_trial(engine, key(1024, 6656, 6656), PARTIAL, template_hash(), TrialStatus.MODEL, 1.0)
    split = GemvConfig(16, 32, 32, rows=1, col_threads=64, lanes=2, cols=4, unroll=8,
                       split_k=16)
    decode = ProblemKey.of(Problem(16, 32, 32, "km"), (1, 4096, 4096), key(1, 1, 1).device, GEMV)
    record_trial(engine, decode, split, GEMV.generator_hash(), TrialStatus.MODEL, 1.0)
    record_trial(engine, decode.at(decode.problem, (1, 4096, 2048)), split.replace(split_k=1),
                 GEMV.generator_hash(), TrialStatus.MODEL, 1.0)
    assert refinement_candidates(engine) == {key(1024, 6656, 6656):
                                             [PARTIAL.replace(stream_k=True)]}
    assert refinement_candidates(engine, min_gain=0, family_name="gemv") == {
        decode: [split.replace(wide_sum=1)]}
