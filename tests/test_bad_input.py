"""Bad input gets a clear error that names the problem (exit status 2 from the command
line), or the documented behaviour; never a traceback, a silent exit 0 or a wrong result.
Each row here is a row of docs/bad-input.md."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nmgen

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "bad-input.md").read_text()
SHIPPED = ROOT / "nmgen" / "tuned_db" / "tuned.sqlite"


def cli(*args: str, cwd: Path | None = None, env: dict | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
    """The command line in a child process (a command that runs on past ``timeout``, as
    one with no limit on its input might, fails the test)."""
    return subprocess.run([sys.executable, "-m", "nmgen.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=timeout)


@pytest.fixture
def files(tmp_path):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("64 256 512\n")
    (tmp_path / "huge.txt").write_text("12345678901234567890 256 512\n")
    (tmp_path / "latin1.txt").write_bytes("# caf\xe9\n64 256 512\n".encode("latin-1"))
    (tmp_path / "text.db").write_text("not a database\n")
    (tmp_path / "a_file").write_text("x\n")
    (tmp_path / "zero.db").write_bytes(b"")
    with sqlite3.connect(tmp_path / "other.db") as other:  # another program's database
        other.execute("CREATE TABLE users (id INTEGER)")
    damaged = bytearray(SHIPPED.read_bytes())
    damaged[100_000:200_000] = b"\xff" * 100_000
    (tmp_path / "damaged.db").write_bytes(damaged)
    (tmp_path / "bad.json").write_text("{not json\n")
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
    ("tune --vec 10**12 (past the kernels' 32-bit L)",
     lambda f: tune(f, "--vec", str(10**12)), 2, "--vec must be at most 2147483647"),
    ("tune --vec 10**9 (far beyond the shapes' N)", lambda f: tune(f, "--vec", str(10**9)),
     2, "vec 1000000000: longer than the weight's N = 256 columns and than 4096"),
    ("tune --trials 10**9", lambda f: tune(f, "--trials", str(10**9)), 2,
     "--trials 1000000000: more than the"),
    ("tune --storage not-a-url", lambda f: tune(f, "--storage", "not-a-url"), 2,
     "expected an SQLAlchemy URL"),
    ("tune --db sqlite:///:memory:", lambda f: tune(f, "--db", "sqlite:///:memory:"), 2,
     "an in-memory database starts empty and ends with the process"),
    ("tune --db another program's SQLite file", lambda f: tune(f, "--db", str(f / "other.db")),
     2, "holds another program's tables (users) and none of nmgen's"),
    ("show --db sqlite:///:memory:", lambda f: ("show", "--db", "sqlite:///:memory:"), 2,
     "an in-memory database"),
    ("show --db a zero-byte file", lambda f: ("show", "--db", str(f / "zero.db")), 2,
     "an empty database, no nmgen records in it"),
    ("show --db another program's SQLite file", lambda f: ("show", "--db", str(f / "other.db")),
     2, "not an nmgen database (it holds users"),
    ("show --db a damaged database file", lambda f: ("show", "--db", str(f / "damaged.db")), 2,
     "the database failed: DatabaseError: database disk image is malformed"),
    ("export --config a file that is not JSON", lambda f: (
        "export", "--config", str(f / "bad.json"), "--out", str(f / "o")), 2,
     "bad.json: not JSON"),
    ("refine --top 0", lambda f: ("refine", "--db", str(f / "t.db"), "--plan", "--top", "0"),
     2, "--top must be at least 1, not 0"),
    ("bench --repeat 0", lambda f: ("bench", "--shapes", str(f / "shapes.txt"), "--repeat",
                                    "0", "--out", str(f / "b")), 2,
     "--repeat must be at least 1, not 0"),
    ("bench-untuned --repeat 0", lambda f: (
        "bench-untuned", "--shapes", str(f / "shapes.txt"), "--problems", "2:4/32",
        "--tuned-db", str(f / "t.db"), "--plan", "h100", "--repeat", "0"), 2,
     "--repeat must be at least 1, not 0"),
    ("selftest --max-size 0", lambda f: ("selftest", "--max-size", "0"), 2,
     "--max-size must be at least 1, not 0"),
    ("selftest --per-config 0", lambda f: ("selftest", "--per-config", "0"), 2,
     "--per-config must be at least 1, not 0"),
    ("carry --remeasure -1", lambda f: ("carry", "--tree", str(ROOT), "--db", str(f / "t.db"),
                                        "--plan", "--remeasure", "-1"), 2,
     "--remeasure must be at least 0, not -1"),
    ("carry --from-rev of a revision git cannot read", lambda f: (
        "carry", "--from-rev", "no-such-rev", "--repo", str(f), "--db", str(f / "t.db"),
        "--plan"), 2, "--from-rev no-such-rev: git cannot read nmgen/ of it"),
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


# ------------------------------------------------------------------ what a run needs
def _without_nvcc(cache: Path) -> dict:
    """This environment with no nvcc on PATH and a fresh enumeration cache (to tell
    whether a command did any work)."""
    nvcc = shutil.which("nvcc")
    folders = os.environ.get("PATH", "").split(os.pathsep)
    if nvcc:
        folders = [d for d in folders if not (Path(d) / "nvcc").exists()]
    return {**os.environ, "PATH": os.pathsep.join(folders), "NMGEN_CACHE_DIR": str(cache)}


def _dry_run(files: Path, *extra: str) -> tuple[str, ...]:
    return ("tune", "--gpu", "h100", "--shapes", str(files / "shapes.txt"), "--pattern", "2:4",
            "--vec", "16", "--trials", "2", "--dry-run", "--db", str(files / "dry.db"),
            "--quiet", *extra)


def test_a_dry_run_without_nvcc_completes(files):
    env = _without_nvcc(files / "cache")
    done = cli(*_dry_run(files), env=env)
    assert done.returncode == 0, done.stderr
    assert "nvcc is not on PATH: the dry run compiles none" in done.stderr
    assert "2 of 2 complete" in done.stdout
    assert "estimated by the model here, none measured" in done.stderr
    assert "measured here)" not in done.stderr
    assert "| tune --dry-run without nvcc |" in DOC
    assert "| a dry run's log |" in DOC


def test_a_dry_run_asked_to_compile_without_nvcc_is_refused_before_any_work(files):
    env = _without_nvcc(files / "cache")
    done = cli(*_dry_run(files, "--compile-top", "2"), env=env)
    assert done.returncode == 2, done.stderr
    assert "--compile-top 2: a dry run compiles the model's best configurations with " \
        "nvcc, which is not on PATH" in done.stderr
    assert not (files / "cache").exists() and not (files / "dry.db").exists()
    assert "| tune --dry-run --compile-top 2 without nvcc |" in DOC


def test_a_tune_without_cupy_says_so_before_any_work(files):
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    env = {**os.environ, "NMGEN_CACHE_DIR": str(files / "cache")}
    done = cli("tune", "--gpu", "h100", "--shapes", str(files / "shapes.txt"), "--pattern",
               "2:4", "--vec", "16", "--db", str(files / "t.db"), "--quiet", env=env)
    assert done.returncode == 2, done.stderr
    assert "running kernels needs CuPy" in done.stderr
    assert not (files / "cache").exists()  # no enumeration was built: nothing was done
    assert "| tune (not a dry run) without CuPy or a CUDA driver |" in DOC


def _sigint_as_a_terminal_gives_it() -> None:
    """SIGINT's default action in the child, as a terminal's Ctrl-C finds it: a test run
    started in the background (``cmd &`` in a script) ignores SIGINT, and so would the
    tune it starts, which then ran all its problems to the end (rc 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_tune_says_what_was_kept_and_exits_130(files):
    (files / "many.txt").write_text("".join(f"{64 * i} 256 512\n" for i in range(1, 31)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmgen.cli", "tune", "--gpu", "h100", "--shapes",
         str(files / "many.txt"), "--pattern", "2:4", "--vec", "16", "--trials", "16",
         "--family", "f32", "--dry-run", "--compile-top", "0", "--db", str(files / "i.db"),
         "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_sigint_as_a_terminal_gives_it)
    seen = []
    for line in proc.stderr:  # a study done: some trials are in the database
        seen.append(line)
        if "trials (" in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen) + err
    assert "Traceback" not in err + out
    assert "interrupted: " in err and "problems complete" in err
    assert "run the same command again to resume" in err
    assert "| Ctrl-C during a tune |" in DOC


# ------------------------------------------------------------------ databases
def test_tune_writes_into_another_programs_database_only_when_forced(files):
    done = cli(*tune(files, "--db", str(files / "other.db"), "--force-db"))
    assert done.returncode == 0, done.stderr
    with sqlite3.connect(files / "other.db") as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert "users" in tables and "nm_trials" in tables
    assert "| tune --db another program's SQLite file --force-db |" in DOC


def test_nmgen_db_in_a_missing_folder_is_refused(files):
    env = {**os.environ, "NMGEN_DB": str(files / "no" / "tuned.db")}
    done = cli("show", env=env)
    assert done.returncode == 2, done.stdout
    assert f"NMGEN_DB={files / 'no' / 'tuned.db'}: its directory" in done.stderr
    assert "| NMGEN_DB naming a missing folder |" in DOC


def test_carry_plan_takes_a_plain_path(files):
    assert cli(*tune(files, "--db", str(files / "plain.db"))).returncode == 0
    done = cli("carry", "--tree", str(ROOT), "--db", str(files / "plain.db"), "--plan")
    assert done.returncode == 0, done.stderr
    assert "nothing was written" in done.stdout
    assert "| carry --plan --db a plain path |" in DOC


# ------------------------------------------------------------------ shapes files
def test_a_shapes_file_with_a_bom_and_repeats_is_read_each_problem_once(files):
    (files / "bom.txt").write_bytes(b"\xef\xbb\xbf64 256 512\n64 256 512\n")
    done = cli(*tune(files, "--shapes", str(files / "bom.txt"), "--pattern", "2:4,2:4"))
    assert done.returncode == 0, done.stderr
    assert "2 of 2 complete" in done.stdout  # f32 and gemv at one shape, once each
    assert "| a shapes file starting with a UTF-8 BOM |" in DOC
    assert "| a shape or a pattern given twice |" in DOC


# ------------------------------------------------------------------ the Python API
def _w(k: int = 64, cols: int = 32) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((k, cols)).astype(np.float32)


def _b() -> nmgen.NMMatrix:
    return nmgen.prune(_w(), "2:4", 16)


def _decide(shape: tuple[int, int, int]):
    from nmgen.dispatch import Dispatcher
    from nmgen.runtime.device import DeviceInfo

    device = DeviceInfo("NVIDIA H100 80GB HBM3", 132, 9, 0, 13000)
    return Dispatcher([], device=device).decide(nmgen.Problem(2, 4, 32), shape)


# (the row of docs/bad-input.md, the call, the exception it raises, what its message says)
API_CASES = [
    ("`prune` with `vec=10**9` (far beyond N)", lambda: nmgen.prune(_w(4, 32), "2:4", 10**9),
     ValueError, "longer than the weight's N = 32 columns and than 4096"),
    ("`prune` with `vec=10**12`", lambda: nmgen.prune(_w(4, 32), "2:4", 10**12), ValueError,
     "must be at most 2147483647"),
    ("`from_compressed` with K past 2**31", lambda: nmgen.NMMatrix.from_compressed(
        _b().values, _b().indices, "2:4", 16, (2**31, 32)), ValueError,
     "K and N must be at most 2147483647"),
    ("`from_compressed` with `shape=None`", lambda: nmgen.NMMatrix.from_compressed(
        _b().values, _b().indices, "2:4", 16, None), ValueError,
     "shape None: expected (K, N), two integers"),
    ("`prune(None, ...)`", lambda: nmgen.prune(None, "2:4", 4), TypeError,
     "expected an array (NumPy, CuPy or PyTorch), got None"),
    ("a NumPy masked array", lambda: nmgen.prune(np.ma.masked_array(_w(), mask=_w() > 0),
                                                 "2:4", 16),
     TypeError, "a masked array: its masked entries would be read as values"),
    ("`nmgen.reference` of complex activations",
     lambda: nmgen.reference(np.ones((2, 64)) + 1j, _b()), TypeError, "a is complex"),
    ("`nmgen.reference` of something not an `NMMatrix`",
     lambda: nmgen.reference(np.ones((2, 64)), _w()), TypeError,
     "b must be an nmgen.NMMatrix"),
    ("`Problem(2, 4, 0)` (L of 0)", lambda: nmgen.Problem(2, 4, 0), ValueError,
     "vec 0: the vector length L must be a positive integer"),
    ("`Problem` of an unknown A layout", lambda: nmgen.Problem(2, 4, 16, "xx"), ValueError,
     "A layout 'xx': expected one of rm, km"),
    ("`Dispatcher.decide` of K past 2**31", lambda: _decide((64, 4096, 2**31 + 5)),
     ValueError, "each at most 2147483647"),
    ("`Dispatcher.decide` of K = -1", lambda: _decide((64, 64, -1)), ValueError,
     "need 0 <= M and 1 <= N, K"),
]


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_the_api_refuses_bad_input_clearly(case):
    what, call, error, says = case
    with pytest.raises(error) as raised:
        call()
    assert says in str(raised.value)
    assert f"| {what} |" in DOC, f"docs/bad-input.md lacks the row {what!r}"


def test_a_dtype_given_as_a_numpy_dtype_is_taken():
    assert nmgen.prune(_w(), "2:4", 16, dtype=np.float16).dtype is nmgen.DType.F16
    assert nmgen.prune(_w(), "2:4", 16, dtype=np.dtype("float16")).dtype is nmgen.DType.F16
    assert "| `dtype=np.float16` or `torch.float16` (a dtype, not its name) |" in DOC


def test_a_bias_given_as_a_list_is_taken_by_the_reference():
    b = _b()
    got = nmgen.reference(np.ones((2, 64)), b, bias=[1.0] * 32)
    np.testing.assert_allclose(got, nmgen.reference(np.ones((2, 64)), b) + 1.0)
    assert "| `nmgen.reference` with a bias given as a list |" in DOC
