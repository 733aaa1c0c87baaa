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
    assert code == nmgen.render(nmgen.KernelConfig.from_name(NAME)).code
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
