"""The command line, run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

import nmgen

NAME = "nm_spmm_f32_n8m32l32_ms128ns128ks32_mt8nt8_w8x4_pack_s2_k1_rm_sm90"


def nmgen_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nmgen.cli", *args], capture_output=True,
                          text=True)


def test_export_by_name(tmp_path):
    result = nmgen_cli("export", "--config", NAME, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    code = (tmp_path / f"{NAME}.cu").read_text()
    assert code.endswith(nmgen.render(nmgen.KernelConfig.from_name(NAME)).code)
    assert "prepare()" in code and "nmgen/families/f32_simt/" in code.split("\n// ---")[0]
    assert json.loads((tmp_path / f"{NAME}.json").read_text())["packing"] is True


def test_export_from_json_file(tmp_path):
    config = nmgen.KernelConfig(2, 4, 16, 64, 64, 16, 4, 4, split_k=2)
    spec = tmp_path / "c.json"
    spec.write_text(config.to_json())
    result = nmgen_cli("export", "--config", str(spec), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / f"{config.name}.cu").exists()


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_export_cubin(tmp_path):
    result = nmgen_cli("export", "--config", NAME, "--out", str(tmp_path), "--cubin")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / f"{NAME}.cubin").stat().st_size > 0
    assert "Used" in (tmp_path / f"{NAME}.ptxas.txt").read_text()


def test_bad_config_is_a_clear_error(tmp_path):
    result = nmgen_cli("export", "--config", "nm_spmm_nonsense", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "is not a kernel name" in result.stderr
    bad = NAME.replace("ks32", "ks48")
    result = nmgen_cli("export", "--config", bad, "--out", str(tmp_path))
    assert result.returncode == 2 and "KS % m == 0" in result.stderr


def test_tune_dry_run_show_and_export_from_db(tmp_path):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("# two small shapes\n64 256 512\n17 300 200\n")
    dry = f"sqlite:///{tmp_path / 'dry.db'}"
    result = nmgen_cli("tune", "--gpu", "h100", "--shapes", str(shapes), "--pattern", "2:4",
                       "--vec", "16", "--family", "f32", "--dry-run", "--trials", "3",
                       "--compile-top", "2", "--db", dry)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("nm_spmm_f32_n2m4l16") == 4  # 2 compiled a problem
    assert "[2/2] model-nmgen_h100_f32_f32_2:4_l16_rm_17x300x200" in result.stdout
    assert "regs=" in result.stdout and "2 of 2 complete" in result.stdout

    from nmgen.policy import summary
    from nmgen.store.database import connect
    from nmgen.store.records import record_trial

    dry_rows = summary(connect(dry))  # the dry run's estimates, never measurements
    assert len(dry_rows) == 2 and all(1 <= r["trials"] <= 3 and r["ok"] == 0
                                      and not r["measured"] for r in dry_rows)
    shown = nmgen_cli("show", "--db", dry)  # the model's choice, marked as not measured
    assert shown.returncode == 0 and shown.stdout.count("(model's choice, not measured)") == 2

    from tests.test_db_dispatch import FAST, KEY

    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    record_trial(connect(url), KEY, FAST, "h", "ok", time_ms=1.0, model_ms=1.2)
    shown = nmgen_cli("show", "--db", url)
    assert shown.returncode == 0 and FAST.name in shown.stdout and "1024" in shown.stdout
    wanted = tmp_path / "wanted.txt"
    wanted.write_text("1024 4096 4096\n")
    out = tmp_path / "kernels"
    exported = nmgen_cli("export", "--from-db", "--db", url, "--shapes", str(wanted),
                         "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    assert (out / f"{FAST.name}.cu").exists()
    assert FAST.name in (out / "index.md").read_text()


def test_shape_file_errors_name_the_line(tmp_path):
    shapes = tmp_path / "bad.txt"
    shapes.write_text("# ok\n64 256 512\n64 256\n")
    result = nmgen_cli("tune", "--gpu", "h100", "--shapes", str(shapes), "--dry-run")
    assert result.returncode == 2 and "bad.txt:3" in result.stderr


def test_unknown_gpu_is_named(tmp_path):
    shapes = tmp_path / "s.txt"
    shapes.write_text("64 256 512\n")
    result = nmgen_cli("tune", "--gpu", "v100", "--shapes", str(shapes), "--dry-run")
    assert result.returncode == 2 and "unknown GPU 'v100'" in result.stderr


def test_compile_process_counts_are_checked(tmp_path):
    shapes = tmp_path / "s.txt"
    shapes.write_text("64 256 512\n")
    for option, value, least in (("--compile-workers", "0", 1), ("--ahead-workers", "-1", 0)):
        result = nmgen_cli("tune", "--gpu", "h100", "--shapes", str(shapes), "--dry-run",
                           option, value)
        assert result.returncode == 2
        assert f"{option} must be at least {least}, not {value}" in result.stderr


def test_version_and_defaults_in_help():
    assert nmgen_cli("--version").stdout.strip() == f"nmgen {nmgen.__version__}"
    usage = " ".join(nmgen_cli("tune", "--help").stdout.split())
    assert "default: 16:32,12:32,8:32,4:32" in usage and "default: 40" in usage


def test_llama_shapes_file():
    from pathlib import Path

    from nmgen.shapes import read_shapes

    shapes = read_shapes(Path(__file__).resolve().parent.parent / "shapes" / "llama.txt")
    assert len(shapes) == 100 and len(set(shapes)) == 100
    assert (4096, 8192, 22016) in shapes and (256, 2048, 2048) in shapes


def test_tune_without_family_gives_each_family_its_regime(tmp_path):
    """A tune naming no family runs the decode family at small M only, the tiled FP32
    family everywhere; naming a family tunes it on every shape."""
    from nmgen.cli import _tasks, build_parser

    shapes = tmp_path / "shapes.txt"
    shapes.write_text("1 4096 4096\n64 4096 4096\n65 4096 4096\n4096 4096 4096\n")
    base = ["tune", "--gpu", "h100", "--shapes", str(shapes), "--pattern", "8:32"]
    tasks = _tasks(build_parser().parse_args(base))
    by_family: dict[str, list[int]] = {}
    for task in tasks:
        by_family.setdefault(task.family.name, []).append(task.shape[0])
    assert by_family == {"f32": [1, 64, 65, 4096], "gemv": [1, 64]}
    named = _tasks(build_parser().parse_args([*base, "--family", "gemv"]))
    assert [t.shape[0] for t in named] == [1, 64, 65, 4096]


def test_quick_tune_dry_run_takes_eight_trials_a_problem(tmp_path):
    """``tune --quick``: 8 trials a problem unless ``--trials`` says otherwise."""
    from nmgen.policy import summary
    from nmgen.store.database import connect

    shapes = tmp_path / "shapes.txt"
    shapes.write_text("1024 4096 4096\n100 4096 11008\n")
    for extra, trials in (((), 8), (("--trials", "5"), 5)):
        db = f"sqlite:///{tmp_path / f'quick{trials}.db'}"
        result = nmgen_cli("tune", "--gpu", "h100", "--shapes", str(shapes), "--pattern",
                           "2:4", "--vec", "32", "--dry-run", "--quick", "--compile-top", "0",
                           "--quiet", "--db", db, *extra)
        assert result.returncode == 0, result.stderr
        assert "2 of 2 complete" in result.stdout
        assert f": {trials} trials" in result.stderr
        rows = summary(connect(db))
        assert len(rows) == 2 and all(1 < r["trials"] <= trials for r in rows)


def test_bench_untuned_plans_without_a_gpu(tmp_path):
    """``bench-untuned --plan``: the kernels each row would time, and a refusal where the
    untuned databases hold the problem or the tuned one lacks it."""
    from nmgen.store.database import connect, shipped_db

    shapes = tmp_path / "shapes.txt"
    shapes.write_text("1024 4096 4096\n256 4096 11008\n")
    empty = tmp_path / "empty.db"
    connect(f"sqlite:///{empty}")
    shipped = str(shipped_db())
    args = ("bench-untuned", "--plan", "h100", "--shapes", str(shapes), "--problems",
            "8:32/32,4:32/32", "--quick")
    planned = nmgen_cli(*args, "--tuned-db", shipped, "--untuned-db", str(empty))
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.count("| model (-) |") == 4 and "| 4 |" in planned.stdout
    held = nmgen_cli(*args, "--tuned-db", shipped)  # the shipped records hold them
    assert held.returncode == 2 and "untuned databases hold records" in held.stderr
    lacking = nmgen_cli(*args, "--tuned-db", str(empty), "--untuned-db", str(empty))
    assert lacking.returncode == 2 and "lacks 4 problems" in lacking.stderr


def test_bench_untuned_dtype_is_parsed_as_tune_and_bench_parse_it():
    from nmgen.cli import build_parser
    from nmgen.format import DType

    base = ["bench-untuned", "--shapes", "s.txt", "--problems", "2:4/32", "--tuned-db", "t"]
    parser = build_parser()
    assert parser.parse_args(base).dtype == "f32"
    for text, dtype in (("bf16", DType.BF16), ("fp16", DType.F16), ("f32", DType.F32)):
        for command in (base, ["bench", "--shapes", "s.txt"], ["tune", "--gpu", "h100",
                                                               "--shapes", "s.txt"]):
            assert DType.parse(parser.parse_args([*command, "--dtype", text]).dtype) is dtype


def test_bench_untuned_plans_bf16_without_a_gpu(tmp_path):
    """``bench-untuned --dtype bf16 --plan``: the model's bf16 choice from an empty
    database against the exact bf16 records of a small tuned one, K-major A too."""
    from nmgen.dispatch import Dispatcher, problem_key
    from nmgen.families.registry import family_of
    from nmgen.format import DType
    from nmgen.problem import ALayout, Problem
    from nmgen.runtime.device import table_device
    from nmgen.store.database import connect
    from nmgen.store.records import record_trial
    from nmgen.store.tables import TrialStatus

    shapes = tmp_path / "shapes.txt"
    shapes.write_text("1024 4096 4096\n16 4096 4096\n")
    empty, tuned = (f"sqlite:///{tmp_path / name}" for name in ("empty.db", "tuned.db"))
    device = table_device("h100")
    connect(empty)
    model = Dispatcher([empty], device=device, write_url="")
    for layout in ALayout:
        problem = Problem(2, 4, 32, layout, device.arch, DType.BF16)
        for shape in ((1024, 4096, 4096), (16, 4096, 4096)):
            config = model.decide(problem, shape).config
            record_trial(connect(tuned), problem_key(family_of(config), problem, shape, device),
                         config, "h", TrialStatus.OK, time_ms=1.0)
        planned = nmgen_cli("bench-untuned", "--plan", "h100", "--shapes", str(shapes),
                            "--problems", "2:4/32", "--dtype", "bf16", "--layout", layout.value,
                            "--tuned-db", tuned, "--untuned-db", empty)
        assert planned.returncode == 0, planned.stderr
        assert planned.stdout.count("| 2:4 | 32 | bf16 |") == 2
        assert planned.stdout.count("| model (-) |") == 2
        assert planned.stdout.count("_bf16_n2m4l32_") == 4
        assert planned.stdout.count(f"_{layout.value}_sm90") == 4  # sm90, or sm90a
    fp32 = nmgen_cli("bench-untuned", "--plan", "h100", "--shapes", str(shapes), "--problems",
                     "2:4/32", "--tuned-db", tuned, "--untuned-db", empty)
    assert fp32.returncode == 2 and "lacks 2 problems" in fp32.stderr
