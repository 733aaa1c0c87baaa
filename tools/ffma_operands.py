"""Do the FFMAs of a kernel read two registers of one bank? A test of the register-bank
explanation for the FP32 kernels' dispatch stalls.

For each FFMA it counts the source registers read from the register file (an operand that
the previous instruction flagged ``.reuse`` in the same slot comes from the reuse cache)
and calls it a conflict when two of them share a bank, bank = register index mod 2 (the
two-bank model of Volta-class register files). Two sources:

- template versions rendered and compiled here with nvcc (no GPU), per configuration:
      python tools/ffma_operands.py --base templates/nm_spmm_f32.cu.j2 \\
          --variants results/fragment_ab_h100/variant_phasedloop4.cu.j2 --cuobjdump PATH
- an Nsight Compute source page (``ncu --page source --csv --print-source sass``):
  the dispatch-stall samples of the FFMAs with and without such a conflict:
      python tools/ffma_operands.py --ncu results/ncu_h100/km16_sass.csv.gz
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _ab import configs_of, sass_listing  # noqa: E402
from _sass import opcode  # noqa: E402
from ncu_stalls import read_rows  # noqa: E402

from nmgen.codegen import render_text  # noqa: E402
from nmgen.compile import compile_with_nvcc  # noqa: E402
from nmgen.config import Arch  # noqa: E402

OPERAND = re.compile(r"-?\|?R(\d+)\|?(\.reuse)?")


def conflicts(instructions: list[str]) -> list[bool | None]:
    """Per instruction: None for a non-FFMA, else whether two register-file reads of the
    FFMA fall in one bank (mod 2)."""
    out: list[bool | None] = []
    cached: dict[int, int] = {}  # slot -> register held by the reuse cache
    for ins in (i.split(";")[0].strip() for i in instructions):
        if opcode(ins) != "FFMA":
            out.append(None)
            cached = {}
            continue
        operands = [o.strip() for o in ins.split(None, 1 + ins.startswith("@"))[-1].split(",")]
        reads, flagged = [], {}
        for slot, text in enumerate(operands[1:]):
            m = OPERAND.fullmatch(text)
            if not m:
                continue
            reg = int(m.group(1))
            if cached.get(slot) != reg:
                reads.append(reg)
            if m.group(2):
                flagged[slot] = reg
        cached = flagged
        banks = [r % 2 for r in reads]
        out.append(len(banks) != len(set(banks)))
    return out


def report_templates(args: argparse.Namespace) -> None:
    versions = [args.base, *(Path(v) for v in args.variants.split(",") if v)]
    print("| configuration | version | FFMA | with a same-bank pair | share |\n"
          "| --- | --- | --- | --- | --- |")
    for config in configs_of(args.configs, Arch.SM90):
        for path in versions:
            cubin = compile_with_nvcc(render_text(config, path.read_text())).path
            flags = [c for c in conflicts(sass_listing(str(cubin), args.cuobjdump))
                     if c is not None]
            print(f"| {config.name} | {path.name} | {len(flags)} | {sum(flags)} | "
                  f"{sum(flags) / len(flags):.0%} |", flush=True)


def report_ncu(path: Path) -> None:
    kernel, rows = read_rows(path)
    flags = conflicts([r["Source"].strip() for r in rows])
    print(f"{kernel}: dispatch-stall samples of FFMAs (two-bank model)\n\n"
          "| FFMAs | count | samples | dispatch-stall samples | share |\n"
          "| --- | --- | --- | --- | --- |")
    for label, want in (("a same-bank pair", True), ("no same-bank pair", False)):
        picked = [r for r, f in zip(rows, flags, strict=True) if f is want]
        samples = sum(int(r["# Samples"] or 0) for r in picked)
        stalls = sum(int(r["stall_dispatch"] or 0) for r in picked)
        print(f"| {label} | {len(picked)} | {samples} | {stalls} | "
              f"{stalls / max(samples, 1):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ncu", type=Path, help="Nsight Compute source page (CSV, .gz too)")
    parser.add_argument("--base", type=Path, default=Path("templates/nm_spmm_f32.cu.j2"))
    parser.add_argument("--variants", default="", help="more template files, comma-separated")
    parser.add_argument("--configs", default="", help="kernel names (default: the core's best)")
    parser.add_argument("--cuobjdump", default="cuobjdump")
    args = parser.parse_args()
    if args.ncu:
        report_ncu(args.ncu)
    else:
        report_templates(args)


if __name__ == "__main__":
    main()
