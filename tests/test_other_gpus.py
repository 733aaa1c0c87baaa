"""Records of other GPUs as evidence: a database holding only another GPU's records is
read, its kernels are moved to this GPU by the family's model and counted as a source of
their own (``other_gpu``), and a record that cannot run here is never run as it is."""

from __future__ import annotations

import importlib
import math
import warnings

import numpy as np
import pytest

import nmgen
from nmgen.calibration import Calibration
from nmgen.dispatch import OTHER_GPU_FIRST, Dispatcher
from nmgen.families.f32_simt import F32_SIMT
from nmgen.families.mma import MMA
from nmgen.families.registry import config_from_name, family_of
from nmgen.families.wgmma import WGMMA
from nmgen.format import DType
from nmgen.gpus import Arch, gpu_spec
from nmgen.other_gpus import GpuModel, borrowed, retarget, retargeted, with_ceilings
from nmgen.policy import other_gpu_records, other_gpus_related
from nmgen.problem import Problem
from nmgen.runtime.device import DeviceInfo, Operand
from nmgen.runtime.launch import Kernel
from nmgen.store.database import connect
from nmgen.store.records import DeviceKey, ProblemKey, record_ceilings, record_trial
from nmgen.store.tables import TrialStatus
from nmgen.transfer import transferred

DISPATCH = importlib.import_module("nmgen.dispatch")  # the module (nmgen.dispatch: its function)
H100 = DeviceKey("h100", "NVIDIA H100 80GB HBM3", 13000, 132)
H200_DEVICE = DeviceInfo("NVIDIA H200", 132, 9, 0, 13000)
A100_DEVICE = DeviceInfo("NVIDIA A100-SXM4-80GB", 108, 8, 0, 13000)
SHAPE = (1024, 4096, 4096)
F32_PROBLEM = Problem(8, 32, 32)
FAST = nmgen.KernelConfig(8, 32, 32, 128, 256, 64, 8, 8, a_tile="tm")
SLOW = nmgen.KernelConfig(8, 32, 32, 64, 128, 32, 8, 4, warp_m=4, warp_n=8)


def record(url: str, family, problem: Problem, config, time_ms: float, shape=SHAPE,
           device: DeviceKey = H100) -> None:
    key = ProblemKey.of(problem, shape, device, family)
    record_trial(connect(url), key, config, "h", TrialStatus.OK, time_ms=time_ms)


@pytest.fixture
def h100_only(tmp_path) -> str:
    """A database of the H100's records of one f32 problem: two kernels."""
    url = f"sqlite:///{tmp_path / 'h100.db'}"
    record(url, F32_SIMT, F32_PROBLEM, FAST, 1.0)
    record(url, F32_SIMT, F32_PROBLEM, SLOW, 1.1)
    return url


def moved_ms(config, time_ms: float, here: str, there: str = "h100", shape=SHAPE) -> float:
    """The model's move of a measured time between GPUs (no calibration)."""
    return time_ms * (F32_SIMT.estimate_ms(config, gpu_spec(here), shape)
                      / F32_SIMT.estimate_ms(config, gpu_spec(there), shape))


def test_only_another_gpus_records_are_read_and_moved_here(h100_only):
    dispatcher = Dispatcher([h100_only], device=H200_DEVICE, calibrate=False)
    decision = dispatcher.decide(F32_PROBLEM, SHAPE)
    assert decision.source == "other_gpu" and decision.origin == "h100 1024x4096x4096"
    expected = {c.name: moved_ms(c, t, "h200") for c, t in ((FAST, 1.0), (SLOW, 1.1))}
    best = min(expected, key=expected.get)
    assert decision.config.name == best
    assert decision.time_ms == pytest.approx(expected[best])
    assert decision.time_ms <= 1.0  # the H200: the H100's SMs and peak, more bandwidth
    # The H100 itself reads them as its own exact records.
    h100 = DeviceInfo(H100.device_name, 132, 9, 0, 13000)
    assert Dispatcher([h100_only], device=h100).decide(F32_PROBLEM, SHAPE).source == "exact"


def test_other_gpu_decisions_are_counted_as_their_own_source_and_warned_once(
        h100_only, monkeypatch):
    shape = (256, 1024, 512)
    record(h100_only, F32_SIMT, F32_PROBLEM, FAST, 0.1, shape)
    weight = nmgen.prune(np.random.default_rng(0).standard_normal((512, 1024)), "8:32", 32)

    def fake_operand(a, what):
        return Operand(0, a.shape, (a.shape[1] * 4, 4), 0, DType.F32, False, "float32")

    monkeypatch.setattr(DISPATCH, "operand", fake_operand)
    monkeypatch.setattr(Kernel, "run", lambda self, *args: None)
    dispatcher = Dispatcher([h100_only], device=H200_DEVICE, write_url="")
    with pytest.warns(UserWarning, match="another GPU's record") as warned:
        dispatcher(np.zeros((256, 512), np.float32), weight)
        dispatcher(np.zeros((256, 512), np.float32), weight)
        dispatcher(np.zeros((255, 512), np.float32), weight)  # another problem
    assert dispatcher.counts == {"other_gpu": 3}
    assert sum("another GPU" in str(w.message) for w in warned) == 1


def test_another_gpus_exact_record_and_this_gpus_nearest_are_ordered_by_a_setting(
        h100_only):
    """The H200 holds a record of a neighbouring shape, the H100 one of the very shape:
    ``other_gpu_first`` says which comes first (on by default)."""
    h200 = DeviceKey("h200", H200_DEVICE.name, 13000, 132)
    record(h100_only, F32_SIMT, F32_PROBLEM, SLOW, 0.6, (512, 4096, 4096), h200)
    first = Dispatcher([h100_only], device=H200_DEVICE, other_gpu_first=True)
    after = Dispatcher([h100_only], device=H200_DEVICE, other_gpu_first=False)
    assert OTHER_GPU_FIRST is True
    assert Dispatcher([h100_only], device=H200_DEVICE).other_gpu_first is True
    assert first.decide(F32_PROBLEM, SHAPE).source == "other_gpu"
    assert (after.decide(F32_PROBLEM, SHAPE).source,
            after.decide(F32_PROBLEM, SHAPE).config) == ("nearest", SLOW)
    # Its own record of the very shape comes before any other GPU's.
    record(h100_only, F32_SIMT, F32_PROBLEM, SLOW, 2.0, SHAPE, h200)
    assert Dispatcher([h100_only], device=H200_DEVICE).decide(
        F32_PROBLEM, SHAPE).source == "exact"


def test_another_gpus_record_of_another_shape_is_an_estimate_ranked_by_time(h100_only):
    """The H100's record of a neighbouring shape, moved here, is an estimate: it ranks with
    the models' choices by time, not before them (the H100's nearest 2:4 L = 128 records,
    ranked first, ran 0.68x dense BF16 on an H200 at M = 8 and 32 where the
    sparse-tensor-core model's choice ran 1.42x / 1.39x: results/other_gpus_h200/order/).
    Its record of the very shape stays a record of the problem."""
    dispatcher = Dispatcher([h100_only], device=H200_DEVICE)
    elsewhere = (512, 4096, 4096)
    borrowed_there = dispatcher._ranking(F32_PROBLEM, elsewhere)
    f32 = next(d for d in borrowed_there if d.config.family == F32_SIMT.name)
    assert f32.source == "other_gpu" and f32.distance > 0 and f32.tier == DISPATCH.ESTIMATES
    assert all(d.tier == DISPATCH.ESTIMATES for d in borrowed_there)
    times = [d.time_ms for d in borrowed_there if d.in_regime]
    assert times == sorted(times)
    exact = dispatcher._ranking(F32_PROBLEM, SHAPE)[0]
    assert (exact.source, exact.distance, exact.tier) == ("other_gpu", 0, DISPATCH.OWN)
    after = Dispatcher([h100_only], device=H200_DEVICE, other_gpu_first=False)
    assert after._ranking(F32_PROBLEM, SHAPE)[0].tier == DISPATCH.OTHER_GPUS


def test_shipped_h100_records_of_other_shapes_do_not_outrank_the_sptc_model_on_an_h200():
    """2:4 L = 128 bf16 decode on an H200, shapes nobody tuned: the H100's `wgmma` and
    `gemv` records of the Llama shapes, moved here, ran 0.42-1.29x dense; the
    sparse-tensor-core model's choice, 1.2-3.7x faster than them, now runs (either
    sparse-tensor-core family's)."""
    dispatcher = Dispatcher(None, device=DeviceInfo("NVIDIA H200", 132, 9, 0, 13020))
    problem = Problem(2, 4, 128, arch=Arch.SM90, dtype=DType.BF16)
    for shape in ((8, 3584, 18944), (32, 4096, 14336), (1, 18944, 3584)):
        ranking = dispatcher._ranking(problem, shape)
        sparse = {"sptc", "mmasp"}
        assert ranking[0].config.family in sparse and ranking[0].source == "model", shape
        # the H100's records moved here, and the H200's own 8:32 records adapted to 2:4
        assert {d.source for d in ranking if d.config.family not in sparse} <= {
            "other_gpu", "transfer"}
        assert all(d.tier == DISPATCH.ESTIMATES for d in ranking)


def test_an_sm90_only_kernel_is_never_run_on_an_sm80_gpu(tmp_path):
    """H100 records on an A100: the wgmma record (sm_90a instructions) is never read, the
    fastest mma record does not fit the A100's shared memory, a TMA kernel of the FP32
    family needs sm_90; what runs is each family's next record rebuilt for sm_80."""
    url = f"sqlite:///{tmp_path / 'h100.db'}"
    bf16 = Problem(8, 32, 64, "km", Arch.SM90, "bf16")
    big = config_from_name("nm_mma_bf16_n8m32l64_b16x256x64_w1x4_s4_km_sm90")
    fits = config_from_name("nm_mma_bf16_n8m32l64_b64x128x32_w4x2_s4_km_sm90")
    hopper = config_from_name("nm_wgmma_bf16_n8m32l64_b64x64x16_g1_s3_km_sm90a")
    record(url, MMA, bf16, big, 0.10)
    record(url, MMA, bf16, fits, 0.20)
    record(url, WGMMA, bf16, hopper, 0.01)
    f32 = Problem(8, 32, 32, "km", Arch.SM90)
    tma = config_from_name("nm_spmm_f32_n8m32l32_ms32ns32ks32_mt4nt8_w8x4_nopack_s3_k1_km_tma_sm90")
    plain = config_from_name("nm_spmm_f32_n8m32l32_ms32ns32ks32_mt4nt8_w8x4_nopack_s3_k1_km_sm90")
    record(url, F32_SIMT, f32, tma, 0.5)
    record(url, F32_SIMT, f32, plain, 0.9)
    a100 = gpu_spec("a100")
    dispatcher = Dispatcher([url], device=A100_DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tensor = dispatcher.decide(Problem(8, 32, 64, "km", Arch.SM80, "bf16"), SHAPE)
        simt = dispatcher.decide(Problem(8, 32, 32, "km", Arch.SM80), SHAPE)
    for decision, expected in ((tensor, fits), (simt, plain)):
        config = decision.config
        assert decision.source == "other_gpu" and decision.origin.startswith("h100")
        assert config.arch is Arch.SM80 and config.name == expected.name.replace("sm90", "sm80")
        family = family_of(config)
        assert family.feasible(config, a100) is None
        assert family.compile_target(config) == "sm_80"
    assert retarget(MMA, big, Problem(8, 32, 64, "km", Arch.SM80, "bf16")) is None
    assert retarget(F32_SIMT, tma, Problem(8, 32, 32, "km", Arch.SM80)) is None
    assert WGMMA.serves(Problem(8, 32, 64, "km", Arch.SM80, "bf16")) is not None
    # Records of the same architecture come first: an H200 record beside the H100's.
    h200 = DeviceKey("h200", H200_DEVICE.name, 13000, 132)
    record(url, MMA, bf16, fits, 0.3, device=h200)
    records = other_gpu_records(connect(url), ProblemKey.of(
        Problem(8, 32, 64, "km", Arch.SM80, "bf16"), SHAPE,
        DeviceKey("a100", A100_DEVICE.name, 13000, 108), MMA))
    assert {r.key.gpu for r in records} == {"h100", "h200"}


def test_same_architecture_records_come_before_other_architectures(tmp_path):
    """On an H200, an A100 record of the very shape and an H100 record of a neighbouring
    one: the H100's (same architecture) is read."""
    url = f"sqlite:///{tmp_path / 'mixed.db'}"
    a100 = DeviceKey("a100", A100_DEVICE.name, 13000, 108)
    sm80 = Problem(8, 32, 32, arch=Arch.SM80)
    record(url, F32_SIMT, sm80, SLOW.replace(arch=Arch.SM80), 1.0, SHAPE, a100)
    record(url, F32_SIMT, F32_PROBLEM, FAST, 1.0, (2048, 4096, 4096))
    decision = Dispatcher([url], device=H200_DEVICE).decide(F32_PROBLEM, SHAPE)
    assert decision.source == "other_gpu" and decision.origin == "h100 2048x4096x4096"
    assert decision.distance > 0


def test_times_move_by_both_calibrations_where_both_gpus_have_them(h100_only):
    """The calibrated models of both GPUs where both are fitted; otherwise the model as
    it is on both (a calibration of one GPU alone would skew the move)."""
    records = other_gpu_records(connect(h100_only), ProblemKey.of(
        F32_PROBLEM, SHAPE, DeviceKey("h200", H200_DEVICE.name, 13000, 132), F32_SIMT))
    h200, h100 = gpu_spec("h200"), gpu_spec("h100")
    plain = Calibration("f32")
    slower = Calibration("f32", weights=(math.log(2.0), 0.0), samples=99)  # 2x the model

    def move(here: Calibration, there: Calibration) -> float:
        found = borrowed(F32_SIMT, F32_PROBLEM, SHAPE, records, lambda key: (
            GpuModel(h200, here), GpuModel(h100, there)), True)
        return next(b.estimate_ms for b in found if b.config == FAST)

    raw = moved_ms(FAST, 1.0, "h200")
    assert move(plain, plain) == pytest.approx(raw)
    assert move(slower, plain) == pytest.approx(raw)  # one fitted: the model as it is
    assert move(slower, Calibration("f32", weights=(math.log(4.0), 0.0), samples=99)) \
        == pytest.approx(raw / 2)


def test_measured_ceilings_move_times_only_where_both_gpus_have_them(h100_only):
    h200, h100 = gpu_spec("h200"), gpu_spec("h100")
    assert with_ceilings(h200, h100, {"h100": (60.0, 3000.0)}) == (h200, h100)
    here, there = with_ceilings(h200, h100, {"h100": (60.0, 3000.0), "h200": (61.0, 4400.0)})
    assert (here.dram_gbs, there.dram_gbs, here.sms) == (4400.0, 3000.0, 132)
    engine = connect(h100_only)
    record_ceilings(engine, "h100", H100.device_name, 60.0, 3000.0)
    record_ceilings(engine, "h200", H200_DEVICE.name, 61.0, 4400.0)
    dispatcher = Dispatcher([h100_only], device=H200_DEVICE, calibrate=False)
    assert dispatcher.ceilings(("h200", "h100", "a100")) == {"h200": (61.0, 4400.0),
                                                              "h100": (60.0, 3000.0)}
    decision = dispatcher.decide(F32_PROBLEM, SHAPE)
    assert decision.time_ms == pytest.approx(min(
        t * F32_SIMT.estimate_ms(c, here, SHAPE) / F32_SIMT.estimate_ms(c, there, SHAPE)
        for c, t in ((FAST, 1.0), (SLOW, 1.1))))


def test_other_gpus_tuned_patterns_transfer_where_none_holds_the_problem(tmp_path):
    """The H100 tuned 16:32 only: a 2:4 problem on the H200 (and on the A100, its
    kernels rebuilt for sm_80, none of TMA) takes their kernels adapted, as a decision
    of other GPUs' records."""
    url = f"sqlite:///{tmp_path / 'h100.db'}"
    wide = nmgen.KernelConfig(16, 32, 32, 128, 256, 64, 16, 8, a_tile="tx", tma=True)
    narrow = nmgen.KernelConfig(16, 32, 32, 64, 128, 128, 8, 8, a_tile="tx")
    donor = Problem(16, 32, 32)
    for shape in (SHAPE, (2048, 4096, 4096)):
        record(url, F32_SIMT, donor, wide, 1.0, shape)
        record(url, F32_SIMT, donor, narrow, 1.2, shape)
    for device, arch in ((H200_DEVICE, Arch.SM90), (A100_DEVICE, Arch.SM80)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            decision = Dispatcher([url], device=device).decide(Problem(2, 4, 32, arch=arch),
                                                               SHAPE)
        config = decision.config
        assert decision.source == "other_gpu" and decision.origin.startswith("h100: ")
        assert (config.family, config.n, config.m, config.arch) == ("f32", 2, 4, arch)
        # A transfer is an estimate: ranked with the models' choices by its time.
        assert decision.tier == DISPATCH.ESTIMATES and math.isfinite(decision.distance)
        # What was ranked: the H100's kernels adapted to 2:4 and rebuilt for this arch.
        problem = Problem(2, 4, 32, arch=arch)
        records = other_gpus_related(connect(url), ProblemKey.of(
            problem, SHAPE, DeviceKey("x", device.name, 13000, device.sms), F32_SIMT))
        moved = transferred(F32_SIMT, problem, SHAPE, gpu_spec(device_gpu(device)),
                            retargeted(F32_SIMT, [r for rs in records.values() for r in rs],
                                       problem))
        assert moved and all(c.arch is arch and (c.n, c.m) == (2, 4) for c, _, _ in moved)
        assert all(origin.startswith("16:32") for _, origin, _ in moved)
        assert (arch is Arch.SM90) == any(c.tma for c, _, _ in moved)


def device_gpu(device: DeviceInfo) -> str:
    return "h200" if "H200" in device.name else "a100"


def test_tune_and_show_stay_exact_per_gpu(h100_only):
    """Only dispatch reads other GPUs' records: an H200 tune starts from nothing of the
    H100's, and ``show`` lists the H100's records as the H100's."""
    from nmgen.policy import summary
    from nmgen.tune.task import TuneTask
    from nmgen.tune.tuner import Tuner

    tuner = Tuner(connect(h100_only), storage=None)
    task = TuneTask(gpu_spec("h200"), F32_SIMT, F32_PROBLEM, *SHAPE)
    key = task.key(H200_DEVICE.name, 13000)
    assert tuner.winner_of(key) is None and tuner.winners(key) == {}
    assert tuner.seeder().neighbours(task, key) == []
    assert tuner.seeder().transferred(task, key) == []
    assert {row["gpu"] for row in summary(connect(h100_only))} == {"h100"}


def test_a_tune_on_a_new_gpu_starts_from_other_gpus_kernels_of_the_problem(h100_only):
    """The H200 tunes a problem the H100 holds: the H100's kernels, fastest moved here
    first, are among the first seeds it measures (a quick H200 tune without them found
    8:32 records that ran 0.73-1.18x the H100's moved there); nothing of the H100's is
    an H200 record."""
    from nmgen.tune.seeds import SEEDS_FROM_OTHER_GPUS
    from nmgen.tune.task import TuneTask
    from nmgen.tune.tuner import Tuner

    tuner = Tuner(connect(h100_only), storage=None)
    task = TuneTask(gpu_spec("h200"), F32_SIMT, F32_PROBLEM, *SHAPE)
    key = task.key(H200_DEVICE.name, 13000)
    moved = Dispatcher([h100_only], device=H200_DEVICE, calibrate=False)._ranking(
        F32_PROBLEM, SHAPE)[0]
    seeds = tuner.seeds(task, key)
    from_others = tuner.seeder().other_gpus(task, key)
    assert set(from_others) == {FAST, SLOW} and from_others[0] == moved.config
    assert set(from_others) <= set(seeds[:1 + len(from_others)])  # after the reference
    assert 1 <= SEEDS_FROM_OTHER_GPUS <= 4
    assert tuner.winner_of(key) is None
    # Another shape of the problem: the H100's nearest record seeds it too (a decode
    # family tunes only its regime; the f32 family tunes every shape).
    far = TuneTask(gpu_spec("h200"), F32_SIMT, F32_PROBLEM, 2048, 4096, 4096)
    assert tuner.seeder().other_gpus(far, far.key(H200_DEVICE.name, 13000))
    # An A100 (sm_80) takes only the kernels it can build: none of them needs TMA here.
    a100 = TuneTask(gpu_spec("a100"), F32_SIMT, Problem(8, 32, 32, arch=Arch.SM80), *SHAPE)
    assert all(c.arch is Arch.SM80 and not c.tma for c in tuner.seeder().other_gpus(
        a100, a100.key(A100_DEVICE.name, 13000)))
