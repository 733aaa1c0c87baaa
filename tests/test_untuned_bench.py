"""``nmgen bench-untuned`` on the host: the problems it reads, the plan it makes from the
databases, its rows, CSV and summary (the timing itself needs a GPU)."""

from __future__ import annotations

import math

import pytest

import nmgen
from nmgen.bench.dense import (
    COMPUTE_32F,
    CUDA_R_16BF,
    CUDA_R_16F,
    CUDA_R_32F,
    Dense,
    dense_of,
    gemm_types,
)
from nmgen.bench.untuned import (
    FIELDS,
    UntunedRow,
    dtype_and_baseline,
    parse_problems,
    plan,
    plan_table,
    read_csv,
    row_of,
    summary_table,
    write_csv,
)
from nmgen.dispatch import Dispatcher, problem_key
from nmgen.families.f32_simt import F32_SIMT
from nmgen.families.registry import family_of
from nmgen.format import DType
from nmgen.problem import ALayout, Problem
from nmgen.runtime.device import table_device
from nmgen.store.database import connect
from nmgen.store.records import DeviceKey, ProblemKey, record_trial
from nmgen.store.tables import TrialStatus

DEVICE = table_device("h100")
SHAPES = [(1024, 4096, 4096), (100, 4096, 11008)]


def test_problems_are_patterns_with_their_vector_length():
    parsed = parse_problems("2:4/32, 8:32/128")
    assert [(p.n, p.m, vec) for p, vec in parsed] == [(2, 4, 32), (8, 32, 128)]
    for bad in ("2:4", "2:4/x", ""):
        with pytest.raises(ValueError):
            parse_problems(bad)


def test_plan_takes_the_first_use_choice_and_the_tuned_winner(tmp_path):
    """Untuned: transferred from the 16:32 record; tuned: the exact record of 2:4; the
    quick candidates start with the untuned kernel."""
    untuned_url, tuned_url = (f"sqlite:///{tmp_path / name}" for name in ("u.db", "t.db"))
    donor = nmgen.KernelConfig(16, 32, 32, 128, 256, 64, 16, 8, a_tile="tx")
    best = nmgen.KernelConfig(2, 4, 32, 128, 128, 32, 8, 8, a_tile="tx")
    for url, config in ((untuned_url, donor), (tuned_url, best)):
        for shape in SHAPES:
            key = ProblemKey.of(Problem(config.n, config.m, 32), shape,
                                DeviceKey("h100", DEVICE.name, 13020, 132), F32_SIMT)
            record_trial(connect(url), key, config, "h", TrialStatus.OK, time_ms=1.0)
    untuned, tuned = (Dispatcher([u], device=DEVICE, write_url="")
                      for u in (untuned_url, tuned_url))
    planned = plan(parse_problems("2:4/32"), SHAPES, untuned, tuned, DEVICE.arch, quick=True)
    assert [p.untuned.source for p in planned] == ["transfer", "transfer"]
    assert all(p.tuned.config == best for p in planned)
    assert all(p.quick[0] == p.untuned.config and len(p.quick) == 4 for p in planned)
    assert dtype_and_baseline(planned) == ("fp32", "cuBLAS SGEMM")
    with pytest.raises(ValueError, match="untuned databases hold records of 2"):
        plan(parse_problems("2:4/32"), SHAPES, tuned, tuned, DEVICE.arch)
    with pytest.raises(ValueError, match="lacks 2 problems"):
        plan(parse_problems("16:32/32"), SHAPES, tuned, tuned, DEVICE.arch)

    times = {"untuned": 1.2, "tuned": 1.0, "dense": 2.0,
             planned[0].quick[1].name: 1.1, planned[0].quick[2].name: 1.05}
    row = row_of(planned[0], times)
    assert (row.pattern, row.vec, row.M, row.N, row.K) == ("2:4", 32, 1024, 4096, 4096)
    assert row.quick_ms == 1.05 and row.ratio == pytest.approx(1.2)
    assert row.untuned_source == "transfer" and row.tuned_config == best.name


def test_records_of_an_older_generator_are_named_not_skipped(tmp_path):
    """A tuned database whose problems an older generator keyed (a template changed since
    the tune): dispatch warns and the comparison refuses to run, naming `nmgen carry`,
    instead of comparing against the current generators' records only."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    config = nmgen.KernelConfig(2, 4, 32, 128, 128, 32, 8, 8, a_tile="tx")
    for generator in (F32_SIMT.generator_hash(), "0" * 64):
        key = ProblemKey.of(Problem(2, 4, 32), SHAPES[0],
                            DeviceKey("h100", DEVICE.name, 13020, 132), generator)
        record_trial(connect(url), key, config, "h", TrialStatus.OK, time_ms=1.0)
    tuned = Dispatcher([url], device=DEVICE, write_url="")
    with pytest.warns(UserWarning, match="1 problems tuned by an older generator"):
        assert tuned.older_generator_problems() == {url: 1}
    with pytest.raises(ValueError, match="1 problems of an older generator.*nmgen carry"):
        plan(parse_problems("2:4/32"), SHAPES[:1], tuned, tuned, DEVICE.arch)
    connect(empty := f"sqlite:///{tmp_path / 'e.db'}")
    current = Dispatcher([empty], device=DEVICE, write_url="")
    assert current.older_generator_problems() == {}


def test_csv_round_trip_and_summary(tmp_path):
    rows = [UntunedRow("2:4", 32, 1024, 4096, 4096, 1.2, 1.0, 2.0, 1.1, "transfer", "x",
                       "a", "b"),
            UntunedRow("2:4", 32, 100, 4096, 11008, 0.5, 0.4, 0.6, None, "model", "model",
                       "c", "d")]
    path = tmp_path / "untuned.csv"
    write_csv(rows, path)
    header = path.read_text().splitlines()[0].split(",")
    assert header[:8] == ["pattern", "vec", "M", "N", "K", "untuned_ms", "tuned_ms",
                          "dense_ms"] and header == FIELDS
    assert read_csv(path) == rows
    table = summary_table(rows)
    assert f"{math.sqrt(1.2 * 1.25):.3f}" in table and "1.250" in table  # geomean, worst
    assert "1.100" in table  # quick / tuned of the one row that has it


@pytest.mark.parametrize("layout", list(ALayout))
def test_bf16_plan_takes_the_model_choice_and_the_tuned_record(tmp_path, layout):
    """A bf16 problem, untuned from an empty database (the model's choice) and tuned from
    a database holding one exact bf16 record a shape; the rows it would make say bf16."""
    empty, tuned_url = (f"sqlite:///{tmp_path / name}" for name in ("e.db", "t.db"))
    connect(empty)
    untuned = Dispatcher([empty], device=DEVICE, write_url="")
    problem = Problem(2, 4, 32, layout, DEVICE.arch, DType.BF16)
    best = {}
    for shape in SHAPES:
        best[shape] = untuned.quick_candidates(problem, shape)[-1]
        key = problem_key(family_of(best[shape]), problem, shape, DEVICE)
        record_trial(connect(tuned_url), key, best[shape], "h", TrialStatus.OK, time_ms=1.0)
    tuned = Dispatcher([tuned_url], device=DEVICE, write_url="")
    planned = plan(parse_problems("2:4/32"), SHAPES, untuned, tuned, DEVICE.arch, layout,
                   DType.BF16)
    assert [p.untuned.source for p in planned] == ["model", "model"]
    assert [p.tuned.config for p in planned] == [best[s] for s in SHAPES]
    assert all(p.problem == problem and p.untuned.config.dtype is DType.BF16
               and p.untuned.config.a_layout is layout for p in planned)
    assert plan_table(planned).count("| bf16 |") == 2
    assert dtype_and_baseline(planned) == ("bf16", "cuBLAS BF16 GEMM")
    with pytest.raises(ValueError, match="lacks 2 problems"):  # its records are bf16 only
        plan(parse_problems("2:4/32"), SHAPES, untuned, tuned, DEVICE.arch, layout)
    row = row_of(planned[0], {"untuned": 1.2, "tuned": 1.0, "dense": 2.0})
    assert row.dtype == "bf16" and row.dense == "BF16 GEMM"


def test_csv_has_the_dtype_and_the_summary_names_the_baseline(tmp_path):
    rows = [UntunedRow("2:4", 32, 1024, 4096, 4096, 1.2, 1.0, 2.0, None, "model", "model",
                       "a", "b", "bf16"),
            UntunedRow("2:4", 32, 1024, 4096, 4096, 1.5, 1.0, 3.0, None, "model", "model",
                       "c", "d", "fp16"),
            UntunedRow("2:4", 32, 1024, 4096, 4096, 2.0, 1.0, 4.0, None, "model", "model",
                       "e", "f")]
    path = tmp_path / "untuned.csv"
    write_csv(rows, path)
    header = path.read_text().splitlines()[0].split(",")
    assert "dtype" in header and header[:8] == FIELDS[:8]
    assert [r.dtype for r in read_csv(path)] == ["bf16", "fp16", "fp32"]
    table = summary_table(rows)
    lines = table.splitlines()
    assert "| dense (cuBLAS) | untuned × dense | tuned × dense |" in lines[0]
    assert "| bf16 | 1 |" in lines[2] and "| BF16 GEMM | 1.67x | 2.00x |" in lines[2]
    assert "| fp16 | 1 |" in lines[3] and "| FP16 GEMM | 2.00x | 3.00x |" in lines[3]
    assert "| fp32 | 1 |" in lines[4] and "| SGEMM | 2.00x | 4.00x |" in lines[4]


def test_csv_without_a_dtype_column_reads_as_fp32(tmp_path):
    row = UntunedRow("2:4", 32, 1024, 4096, 4096, 1.2, 1.0, 2.0)
    path = tmp_path / "untuned.csv"
    write_csv([row], path)
    lines = [",".join(line.split(",")[:-1]) for line in path.read_text().splitlines()]
    path.write_text("\n".join(lines) + "\n")  # the columns before dtype
    assert read_csv(path) == [row]


def test_each_dtype_has_cublas_gemm_of_its_own_type():
    """The baseline of each dtype and the cudaDataType cublasGemmEx gets: FP16 inputs
    (and output where it keeps theirs) as CUDA_R_16F, FP32 accumulation at 16 bits."""
    assert [dense_of(d) for d in DType] == [Dense.SGEMM, Dense.BF16, Dense.F16]
    assert gemm_types(Dense.F16) == (CUDA_R_16F, CUDA_R_32F, COMPUTE_32F)
    assert gemm_types(Dense.F16, same_dtype_out=True) == (CUDA_R_16F, CUDA_R_16F, COMPUTE_32F)
    assert gemm_types(Dense.BF16, same_dtype_out=True) == (CUDA_R_16BF, CUDA_R_16BF,
                                                           COMPUTE_32F)
    assert gemm_types(Dense.TF32)[:2] == (CUDA_R_32F, CUDA_R_32F)
    with pytest.raises(ValueError, match="SGEMM is no cublasGemmEx"):
        gemm_types(Dense.SGEMM)
