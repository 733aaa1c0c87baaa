"""Where warps wait, from Nsight Compute's per-instruction source page: the not-issued
PC samples of a kernel summed by stall reason and by opcode, and its top instructions.

    ncu --section SourceCounters ... -o report python3 tools/profile_one.py NAME
    ncu --import report.ncu-rep --page source --csv --print-source sass > sass.csv
    python tools/ncu_stalls.py sass.csv [more.csv.gz ...]
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
from pathlib import Path


def opcode(instruction: str) -> str:
    """``FFMA`` of ``@!P0 FFMA.FTZ R1, R2, R3, R1 ;``: the opcode without predicate or
    modifiers."""
    words = instruction.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""

NOT_ISSUED = "Warp Stall Sampling (Not-issued Samples)"
ALL = "Warp Stall Sampling (All Samples)"


def read_rows(path: Path) -> tuple[str, list[dict[str, str]]]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    lines = list(csv.reader(io.StringIO(raw.decode())))
    kernel, header = lines[0][1], lines[1]
    return kernel, [dict(zip(header, r, strict=False)) for r in lines[2:] if len(r) == len(header)]


def summarize(path: Path, top: int) -> None:
    kernel, rows = read_rows(path)
    reasons = [k for k in rows[0] if k.endswith("(Not Issued)")] if rows else []
    by_reason: collections.Counter = collections.Counter()
    by_opcode: collections.Counter = collections.Counter()
    for row in rows:
        by_opcode[opcode(row["Source"])] += int(row[NOT_ISSUED] or 0)
        for reason in reasons:
            by_reason[reason.split(" ")[0]] += int(row[reason] or 0)
    total = sum(int(r[ALL] or 0) for r in rows)
    waiting = sum(by_reason.values())
    print(f"{kernel}\n  samples {total}, not issued {waiting} ({waiting / max(total, 1):.1%})")
    print("  by reason: " + ", ".join(f"{k} {v}" for k, v in by_reason.most_common(8)))
    print("  by opcode: " + ", ".join(f"{k} {v}" for k, v in by_opcode.most_common(8)))
    for row in sorted(rows, key=lambda r: -int(r[NOT_ISSUED] or 0))[:top]:
        print(f"  {int(row[NOT_ISSUED]):6d}  {row['Source'].strip()[:64]}")
    by_count(rows, total)


def by_count(rows: list[dict[str, str]], total: int) -> None:
    """Samples and executed instructions by how often an instruction ran: in a kernel of
    nested loops each count is a loop level (the compute body, a stage, the whole block)."""
    groups: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for row in rows:
        runs = int(row["Instructions Executed"] or 0)
        groups[runs][0] += 1
        groups[runs][1] += int(row[ALL] or 0)
        groups[runs][2] += runs
    executed = sum(g[2] for g in groups.values())
    print("  by execution count (instructions, share of samples, share of executed):")
    for runs, (count, samples, ran) in sorted(groups.items(), key=lambda g: -g[1][1])[:6]:
        print(f"    {runs:9d} x {count:5d}: {samples / max(total, 1):6.1%} "
              f"{ran / max(executed, 1):6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path, nargs="+")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    for path in args.csv:
        summarize(path, args.top)


if __name__ == "__main__":
    main()
