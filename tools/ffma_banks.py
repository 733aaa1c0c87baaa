"""Register-bank pressure of a kernel's FFMAs, read off its SASS: for every FFMA, the
source registers read from the register file (not the reuse cache) that share a bank
(register number mod 4) with another of its sources. Each such pair costs the FFMA an
extra register-file read cycle. Compares a kernel with its stream-K twin, optionally
rendered from another template.

    python tools/ffma_banks.py \\
        nm_spmm_f32_n16m32l32_ms128ns256ks64_mt16nt8_w8x4_nopack_s2_k1_km_sm90 \\
        [--template FILE.j2]

Needs nvcc and cuobjdump (next to nvcc, or on PATH). The fifteenth session's stream-K
kernel of 16x8 tiles showed 1,828 such reads over 2,048 FFMAs, against 371 in the
data-parallel kernel; results/stream_k_h100/README.md has the story.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.codegen import render, render_text  # noqa: E402
from nmgen.compile import compile_with_nvcc, nvcc_path  # noqa: E402
from nmgen.config import KernelConfig  # noqa: E402
from nmgen.refine import stream_k_twin  # noqa: E402

FFMA = re.compile(r"FFMA R\d+, (R\d+)(\.reuse)?, (R\d+)(\.reuse)?, (R\d+)(\.reuse)?")


def cuobjdump() -> str:
    nvcc = nvcc_path()
    beside = Path(nvcc).parent / "cuobjdump" if nvcc else None
    return str(beside) if beside and beside.exists() else shutil.which("cuobjdump") or "cuobjdump"


def bank_pressure(config: KernelConfig, template: str | None) -> tuple[int, int, int, int]:
    """(FFMAs, same-bank register-file reads, registers, spill bytes stored)."""
    source = render(config) if template is None else render_text(config, template)
    compiled = compile_with_nvcc(source)
    sass = subprocess.run([cuobjdump(), "-sass", str(compiled.path)], capture_output=True,
                          text=True, check=True).stdout
    ffmas = same_bank = 0
    for match in FFMA.finditer(sass):
        ffmas += 1
        banks = [int(match.group(i)[1:]) % 4 for i in (1, 3, 5) if not match.group(i + 1)]
        same_bank += len(banks) - len(set(banks))
    main = compiled.resources[config.name]
    return ffmas, same_bank, main.registers, main.spill_stores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", help="data-parallel kernel names")
    parser.add_argument("--template", type=Path, help="render the stream-K twins from this")
    args = parser.parse_args()
    template = args.template.read_text() if args.template else None
    print("| kernel | FFMAs | same-bank reads | registers | spill bytes |")
    print("| --- | --- | --- | --- | --- |")
    for name in args.names:
        config = KernelConfig.from_name(name)
        for kernel, text in ((config, None), (stream_k_twin(config), template)):
            if kernel is not None:
                print(f"| `{kernel.name}` | " + " | ".join(map(str, bank_pressure(kernel, text)))
                      + " |")


if __name__ == "__main__":
    main()
