"""One problem key: dispatch, the tuner and the calibration key records through
``ProblemKey.of`` alone, and the key holds the ``Problem`` itself (nothing rebuilds one
from the store's strings but the reading of a stored row)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from nmgen.dispatch import problem_key
from nmgen.families.f32_simt import F32_SIMT
from nmgen.gpus import Arch, gpu_spec
from nmgen.problem import Problem
from nmgen.runtime.device import DeviceInfo
from nmgen.store import records
from nmgen.store.database import connect
from nmgen.store.records import DeviceKey, ProblemKey, all_problems, record_trial
from nmgen.store.tables import TrialStatus
from nmgen.tune.task import TuneTask

PACKAGE = Path(records.__file__).resolve().parent.parent
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", 132, 9, 0, 13000)
PROBLEM = Problem(8, 32, 32, "km", Arch.SM90, "f32")
SHAPE = (256, 4096, 4096)


def _sources() -> dict[str, str]:
    return {p.relative_to(PACKAGE).as_posix(): p.read_text() for p in PACKAGE.rglob("*.py")}


def test_one_place_in_the_package_constructs_a_problem_key():
    """No module but the key's own names its constructor, none edits a key's fields with
    ``dataclasses.replace``, and the key's own module builds it in ``ProblemKey.of``."""
    sources = _sources()
    outside = {path: len(re.findall(r"\bProblemKey\(", text))
               for path, text in sources.items() if path != "store/records.py"}
    assert sum(outside.values()) == 0, {p: n for p, n in outside.items() if n}
    own = inspect.getsource(ProblemKey)
    assert len(re.findall(r"\bcls\(", own)) == 1
    assert "ProblemKey(" not in sources["store/records.py"].replace("class ProblemKey:", "")
    edits = [path for path, text in sources.items()
             if re.search(r"replace\(\s*key\s*,", text)]
    assert edits == []


def test_no_module_rebuilds_a_problem_from_a_keys_strings():
    assert "problem_of" not in "".join(_sources().values())


def test_dispatch_and_the_tuner_key_the_same_problem_alike():
    from_dispatch = problem_key(F32_SIMT, PROBLEM, SHAPE, H100)
    from_tuner = TuneTask(gpu_spec("h100"), F32_SIMT, PROBLEM, *SHAPE).key(H100.name, 13000)
    assert from_dispatch == from_tuner
    assert from_dispatch.problem is PROBLEM
    assert (from_dispatch.gpu, from_dispatch.arch, from_dispatch.dtype,
            from_dispatch.a_layout, from_dispatch.rows) == ("h100", "sm_90", "f32", "km", 256)


def test_a_stored_problem_reads_back_as_the_key_it_was_stored_under(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'tuned.db'}")
    key = ProblemKey.of(PROBLEM, SHAPE, DeviceKey("h100", H100.name, 13000, 132), F32_SIMT)
    record_trial(engine, key, F32_SIMT.reference_config(PROBLEM), "h", TrialStatus.OK, 1.0)
    (stored,) = all_problems(engine)
    assert stored.key == key and stored.key.problem == PROBLEM
    other = key.at(Problem(2, 4, 32), (1, 2, 3))
    assert (other.device, other.template_hash, other.shape) == (key.device,
                                                                 key.template_hash, (1, 2, 3))


def test_a_stored_problem_of_an_unknown_arch_is_left_out(tmp_path):
    from sqlalchemy import update

    from nmgen.store.tables import GpuRow

    engine = connect(f"sqlite:///{tmp_path / 'tuned.db'}")
    key = ProblemKey.of(PROBLEM, SHAPE, DeviceKey("b200", "NVIDIA B200", 13000, 148), F32_SIMT)
    record_trial(engine, key, F32_SIMT.reference_config(PROBLEM), "h", TrialStatus.OK, 1.0)
    with engine.begin() as conn:
        conn.execute(update(GpuRow).values(arch="sm_100"))
    assert all_problems(engine) == []
    with pytest.raises(ValueError):
        ProblemKey.of(Problem(8, 32, 32, arch="sm_100"), SHAPE, key.device, F32_SIMT)
