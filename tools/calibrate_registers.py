"""How far the model's register estimate (``KernelConfig.registers_estimate``) is from what
ptxas needs, on random configurations of one A tile: for each, the registers ptxas uses
without a budget, the fewest registers (a multiple of 8) it needs without spilling, and
whether the budget that the estimate implies today (``model.min_blocks_per_sm``) spills.
No GPU: nvcc only.

    python tools/calibrate_registers.py --tile tr --count 40 --out results/registers_tr.csv
"""

from __future__ import annotations

import argparse
import csv
import random
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.codegen import KernelSource, render  # noqa: E402
from nmgen.compile import compile_with_nvcc  # noqa: E402
from nmgen.config import ALayout, Arch, ATile, ConfigError, KernelConfig  # noqa: E402
from nmgen.model import register_budget  # noqa: E402
from nmgen.space import Problem, random_config  # noqa: E402

BOUNDS = re.compile(r"__launch_bounds__\(THREADS, \d+\)")
PATTERNS = [(2, 4), (8, 32), (4, 16), (16, 64), (16, 32), (4, 32)]


def compiled(config: KernelConfig, max_registers: int | None = 0):
    """ptxas resources of ``config``: with its own launch bounds (0), with at most
    ``max_registers`` a thread, or with no budget but the block size (None)."""
    code = render(config).code
    if max_registers is None:
        code = BOUNDS.sub("__launch_bounds__(THREADS)", code, count=1)
    elif max_registers:
        code = BOUNDS.sub(f"__maxnreg__({max_registers})", code, count=1)
    return compile_with_nvcc(KernelSource(config, code)).resources[config.name]


def spill_free_minimum(config: KernelConfig, natural: int) -> int:
    """Fewest registers (a multiple of 8) at which ptxas does not spill."""
    low, high = 64, -(-natural // 8) * 8  # high never spills: ptxas chose it freely
    while low < high:
        middle = (low + high) // 16 * 8
        res = compiled(config, middle)
        if res.spill_stores or res.spill_loads:
            low = middle + 8
        else:
            high = middle
    return high


def measure(config_json: str) -> dict:
    config = KernelConfig.from_json(config_json)
    natural = compiled(config, None).registers
    now = compiled(config)
    return {"config": config.name, "stages": config.stages, "a_slots": config.a_slots,
            "mt_nt": config.mt * config.nt, "estimate": config.registers_estimate,
            "budget": register_budget(config), "natural": natural,
            "spill_free_min": spill_free_minimum(config, natural),
            "spills_at_budget": max(now.spill_stores, now.spill_loads)}


def sample(tile: ATile, count: int, seed: int) -> list[KernelConfig]:
    rng = random.Random(seed)
    configs: list[KernelConfig] = []
    while len(configs) < count:
        layout = rng.choice(list(ALayout)) if tile is ATile.K_MAJOR else ALayout.ROW_MAJOR
        problem = Problem(*rng.choice(PATTERNS), rng.choice([4, 8, 32, 128]),
                          a_layout=layout, arch=rng.choice(list(Arch)))
        try:
            packing = tile is not ATile.K_MAJOR_STAGED and rng.random() < 0.5
            configs.append(random_config(problem, rng, max_threads=512).replace(
                a_tile=tile.value, packing=packing))
        except ConfigError:
            continue
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tile", default="tr", choices=[t.value for t in ATile])
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    configs = sample(ATile(args.tile), args.count, args.seed)
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(measure, [c.to_json() for c in configs]))
    short = [r["spill_free_min"] - r["estimate"] for r in rows]
    spilling = [r for r in rows if r["spills_at_budget"]]
    print(f"{len(rows)} {args.tile} kernels: spill-free minimum - estimate: min {min(short)}, "
          f"max {max(short)}; spilling at today's budget: {len(spilling)}")
    for r in spilling:
        print(f"  {r['config']}: estimate {r['estimate']}, budget {r['budget']}, "
              f"needs {r['spill_free_min']}, spills {r['spills_at_budget']} B")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
