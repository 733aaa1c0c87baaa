"""``examples/llama.py`` end to end on the CPU (a smoke test of the harness: tiny model,
eager): every variant runs without error, the logit check passes, and ``--profile-steps``
splits a decode step's time by kernel kind, nmgen's op among them."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "llama.py"


def load_example():
    spec = importlib.util.spec_from_file_location("llama_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_quick_run_on_cpu_with_a_decode_profile(tmp_path):
    example = load_example()
    rc = example.main(["--quick", "--device", "cpu", "--modes", "eager", "--patterns", "8:32",
                       "--vec", "16", "--no-semi24", "--batches", "1", "--profile-steps", "1",
                       "--fuse", "only", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "results.json").read_text())
    assert rc == 0, [row["error"] for row in record["rows"]]
    dense, sparse = record["rows"]
    assert sparse["variant"].endswith(" fused") and sparse["notes"] == ["4 sibling groups fused"]
    assert sparse["logits_within_tol"] is True
    assert sparse["decode_step_us"]["nmgen"] > 0 and "nmgen" not in dense["decode_step_us"]
    for row in (dense, sparse):
        assert row["decode_step_us"]["total"] > 0 and row["decode_step_us"]["kernels"] > 0
    # nmgen's op is part of the sparse model's step, not all of it
    assert sparse["decode_step_us"]["nmgen"] < sparse["decode_step_us"]["total"]
    assert "GPU time of one decode step at batch 1" in (tmp_path / "results.md").read_text()


def test_kernel_kinds():
    kind = load_example().kernel_kind
    assert kind("nm_gemv_bf16_n8m32l128_r1_t64x2_c4_u8_k32_rm_sm90") == "nmgen"
    assert kind("nvjet_hsh_64x8_64x16_2x1_v_bz_splitK_TNT") == "dense GEMM"
    assert kind("flash_fwd_splitkv_kernel") == "attention"
    assert kind("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "other"
