"""Bad input gets a clear error that names the problem (exit status 2 from the command
line), or the documented behaviour; never a traceback, a silent exit 0 or a wrong result.
Each row here is a row of docs/bad-input.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nmgen

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "bad-input.md").read_text()


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nmgen.cli", *args], capture_output=True,
                          text=True, cwd=cwd)


@pytest.fixture
def files(tmp_path):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("64 256 512\n")
    (tmp_path / "huge.txt").write_text("12345678901234567890 256 512\n")
    (tmp_path / "latin1.txt").write_bytes("# caf\xe9\n64 256 512\n".encode("latin-1"))
    (tmp_path / "text.db").write_text("not a database\n")
    (tmp_path / "a_file").write_text("x\n")
    return tmp_path


def tune(files: Path, *extra: str) -> tuple[str, ...]:
    return ("tune", "--gpu", "h100", "--shapes", str(files / "shapes.txt"), "--pattern",
            "2:4", "--vec", "16", "--trials", "2", "--dry-run", "--compile-top", "0",
            "--db", f"sqlite:///{files / 'tuned.db'}", "--quiet", *extra)


# (what is given, arguments as a function of the files folder, exit status, what stderr or
# stdout says)
CASES = [
    ("tune --vec 0", lambda f: tune(f, "--vec", "0"), 2, "--vec must be at least 1, not 0"),
    ("tune --vec -1", lambda f: tune(f, "--vec", "-1"), 2, "--vec must be at least 1"),
    ("tune --vec 7 (no tile width is a multiple or a divisor of 7)",
     lambda f: tune(f, "--vec", "7"), 2, "no f32 kernel fits 2:4 L=7"),
    ("tune --vec 1000", lambda f: tune(f, "--vec", "1000"), 2, "no f32 kernel fits 2:4 L=1000"),
    ("tune --pattern ,,", lambda f: tune(f, "--pattern", ",,"), 2, "no pattern given"),
    ("tune --pattern 3:2", lambda f: tune(f, "--pattern", "3:2"), 2, "need 1 <= n <= m"),
    ("tune --time-budget -1", lambda f: tune(f, "--time-budget", "-1"), 2,
     "--time-budget must be a positive number of seconds"),
    ("tune --trials 0", lambda f: tune(f, "--trials", "0"), 2, "--trials must be at least 1"),
    ("tune --trials -5", lambda f: tune(f, "--trials", "-5"), 2, "--trials must be at least 1"),
    ("tune --dtype f64", lambda f: tune(f, "--dtype", "f64"), 2, "dtype 'f64': expected one of"),
    ("tune --dtype bf16 --family f32 (a family that does not serve it)",
     lambda f: tune(f, "--dtype", "bf16", "--family", "f32"), 2,
     "--family f32: f32 kernels take f32"),
    ("tune --family nope", lambda f: tune(f, "--family", "nope"), 2,
     "unknown kernel family 'nope'"),
    ("--db garbage://x", lambda f: ("show", "--db", "garbage://x"), 2,
     "SQLAlchemy knows no database 'garbage'"),
    ("--db 'not a url://'", lambda f: ("show", "--db", "not a url://"), 2,
     "is neither a database URL"),
    ("--db in a missing directory", lambda f: tune(f, "--db", str(f / "no" / "t.db")), 2,
     "does not exist"),
    ("--db a text file", lambda f: ("show", "--db", str(f / "text.db")), 2,
     "file is not a database"),
    ("show --db a missing file (nothing is created)",
     lambda f: ("show", "--db", str(f / "missing.db")), 2, "no database at"),
    ("shapes file with a 20-digit number", lambda f: tune(f, "--shapes", str(f / "huge.txt")),
     2, "huge.txt:1: '12345678901234567890 256 512': each of M, N and K must be at most"),
    ("shapes file not in UTF-8", lambda f: tune(f, "--shapes", str(f / "latin1.txt")), 2,
     "latin1.txt: not a UTF-8 text file"),
    ("shapes file missing", lambda f: tune(f, "--shapes", str(f / "none.txt")), 2,
     "none.txt: No such file or directory"),
    ("export onto an existing file", lambda f: (
        "export", "--config", "nm_spmm_f32_n2m4l16_ms64ns64ks16_mt4nt4_w8x4_nopack_s2_k1_rm_sm90",
        "--out", str(f / "a_file")), 2, "a_file: File exists"),
    ("export into a folder under a file", lambda f: (
        "export", "--config", "nm_spmm_f32_n2m4l16_ms64ns64ks16_mt4nt4_w8x4_nopack_s2_k1_rm_sm90",
        "--out", str(f / "a_file" / "out")), 2, "Not a directory"),
    ("export --config not-a-name", lambda f: ("export", "--config", "nm_spmm_x", "--out",
                                              str(f / "o")), 2, "is not a kernel name"),
    ("--version", lambda f: ("--version",), 0, f"nmgen {nmgen.__version__}"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_command_line_refuses_bad_input_clearly(case, files):
    what, args, status, says = case
    done = cli(*args(files))
    assert done.returncode == status, (done.stdout, done.stderr)
    output = done.stdout + done.stderr
    assert says in output, output
    assert "Traceback" not in output, output
    assert f"| {what} |" in DOC, f"docs/bad-input.md lacks the row {what!r}"


def test_a_tune_already_complete_says_so_and_exits_0(files):
    first = cli(*tune(files))
    assert first.returncode == 0, first.stderr
    again = cli(*tune(files))
    assert again.returncode == 0, again.stderr
    assert "problems already have their 2 trials" in again.stdout
    assert "| tune of problems already complete |" in DOC


def test_a_plain_path_is_a_sqlite_database(files):
    done = cli(*tune(files, "--db", str(files / "plain.db")))
    assert done.returncode == 0, done.stderr
    assert (files / "plain.db").exists()
    assert "| --db a plain path |" in DOC


def test_a_read_only_database_is_refused_before_any_work(files, monkeypatch):
    """(Root may write any file, so the test makes the file look read-only.)"""
    from nmgen.store import database

    path = files / "ro.db"
    database.connect(str(path))
    monkeypatch.setattr(database.os, "access", lambda p, mode: False)
    with pytest.raises(database.DatabaseError, match="the database is read-only"):
        database.connect(str(path))
    assert database.connect(str(path), writable=False) is not None  # reading is fine
    assert "| --db a read-only database |" in DOC


def test_a_problem_beyond_32_bit_indexing_is_refused():
    from nmgen.runtime.device import Operand
    from nmgen.runtime.launch import check_a

    b = nmgen.prune(np.ones((64, 32), np.float32), "2:4", 16)
    config = nmgen.KernelConfig(2, 4, 16, 64, 64, 16, 4, 4)
    huge = Operand(0, (3_000_000_000, 64), (256, 4), 0, nmgen.DType.F32, False, "float32")
    with pytest.raises(ValueError, match="must be at most 2147483647"):
        check_a(huge, b, config)
    assert "| M = 3e9 at a call |" in DOC


def test_dispatch_of_a_problem_no_family_fits_names_it(monkeypatch):
    """(The decode family fits every L; with the FP32 family alone, L = 7 fits nothing.)"""
    from nmgen.dispatch import Dispatcher
    from nmgen.families import registry
    from nmgen.runtime.device import DeviceInfo

    monkeypatch.setattr(sys.modules["nmgen.dispatch"], "serving",
                        lambda problem: [registry.get("f32")])
    dispatcher = Dispatcher([], device=DeviceInfo("NVIDIA H100 80GB HBM3", 132, 9, 0, 13000))
    with pytest.raises(ValueError, match="no kernel of the families serving 2:4 L=7"):
        dispatcher.decide(nmgen.Problem(2, 4, 7), (64, 64, 64))
    assert "| dispatch of a problem no kernel fits |" in DOC


def test_a_bias_that_does_not_fit_the_kernel_is_refused():
    from nmgen.runtime.device import Operand
    from nmgen.runtime.launch import check_bias

    config = nmgen.KernelConfig(2, 4, 16, 64, 64, 16, 4, 4, epilogue="bias")
    a = Operand(0, (8, 64), (256, 4), 0, nmgen.DType.F32, False, "float32")

    def bias(shape, strides, dtype=nmgen.DType.F32):
        return Operand(0, shape, strides, 0, dtype, False, "x")

    with pytest.raises(ValueError, match="bias has shape"):
        check_bias(bias((31,), (4,)), a, 32, config)
    with pytest.raises(TypeError, match="takes a f32 bias"):
        check_bias(bias((32,), (2,), nmgen.DType.F16), a, 32, config)
    with pytest.raises(ValueError, match="contiguous"):
        check_bias(bias((32,), (8,)), a, 32, config)
    check_bias(bias((32,), (4,)), a, 32, config)
    assert "| a bias of the wrong shape, dtype or strides |" in DOC
    assert "| a bias to a kernel that adds none, or none to one that adds one |" in DOC


def test_an_unknown_activation_names_those_taken():
    b = nmgen.prune(np.ones((64, 32), np.float32), "2:4", 16)
    with pytest.raises(ValueError, match="relu, gelu, gelu_tanh, silu"):
        nmgen.reference(np.ones((2, 64)), b, activation="tanh")
    assert '| an unknown activation, e.g. `"tanh"` |' in DOC
