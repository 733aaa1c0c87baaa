"""Does the analytic model of the working tree give the same estimates as an older
revision's? Compares ``estimate`` field by field and ``rank`` order by order, exactly (no
tolerance), over spaces of several GPUs, patterns, layouts and shapes; used when the
model's arithmetic is restructured without meaning to change it (numpy ranking,
seventeenth session: 450,000 pairs, all equal).

    python tools/model_equivalence.py 936b105 [--per-space 3000]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import nmgen.model as model
from nmgen.config import ALayout
from nmgen.space import enumerate_configs
from nmgen.tuner import TuneTask

GPUS = ("h100", "a100", "l4")
PATTERNS = ((8, 32, 32), (2, 4, 16), (16, 32, 32), (4, 32, 32), (1, 4, 8))
SHAPES = ((1, 7, 33), (256, 2048, 2048), (1000, 5120, 13824), (4096, 4096, 4096),
          (17, 255, 1000))


def model_at(rev: str):
    """``nmgen/model.py`` as it was at ``rev``, imported beside the current one."""
    source = subprocess.run(["git", "show", f"{rev}:nmgen/model.py"], capture_output=True,
                            text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "model_old.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("nmgen.model_old", path)
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old  # dataclasses look their module up
    spec.loader.exec_module(old)
    return old


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", help="git revision of the reference model")
    parser.add_argument("--per-space", type=int, default=3000,
                        help="configurations sampled from each space (all if fewer)")
    args = parser.parse_args()
    old, rng, pairs = model_at(args.rev), random.Random(1), 0
    for gpu in GPUS:
        for n, m, vec in PATTERNS:
            for layout in ALayout:
                task = TuneTask(model.gpu_spec(gpu), n, m, vec, layout, 1, 1, 1)
                space = [c for c in enumerate_configs(task.problem)
                         if task.space.contains(c) and model._fixed(c, task.gpu).infeasible
                         is None]
                sample = space if len(space) <= args.per_space else rng.sample(
                    space, args.per_space)
                for shape in SHAPES:
                    for config in sample:
                        new_e = model.estimate(config, model.GPUS[gpu], *shape)
                        old_e = old.estimate(config, old.GPUS[gpu], *shape)
                        if dataclasses.astuple(new_e) != dataclasses.astuple(old_e):
                            sys.exit(f"differs: {config.name} {shape}: {old_e} -> {new_e}")
                        pairs += 1
                    new_rank = [c.name for _, c in model.rank(space, model.GPUS[gpu], *shape)]
                    old_rank = [c.name for _, c in old.rank(space, old.GPUS[gpu], *shape)]
                    if new_rank != old_rank:
                        sys.exit(f"rank differs: {gpu} {n}:{m} L={vec} {layout.value} {shape}")
    print(f"identical: {pairs} (configuration, shape) estimates and every rank order")


if __name__ == "__main__":
    main()
