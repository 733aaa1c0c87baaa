"""Stream-K against the data-parallel grid: the tuned winner of each problem and its
stream-K twin (the same tiles run by a persistent grid that shares the last waves' stages
out evenly), timed in turns in one process, each checked against float64 first.

    python tools/stream_k_ab.py --pattern 16:32,12:32,8:32,4:32 --layout km \
        --shape 4096,4096,4096 --shape 1024,6656,6656 --out results/stream_k_ab_h100.md

The winner comes from the tuned database the dispatcher reads (`--core` adds the
hand-picked kernel of the core benchmark and its twin). The model's wave efficiency of
each is printed beside: what stream-K is for.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _ab import problem_inputs  # noqa: E402

from nmgen.codegen import render  # noqa: E402
from nmgen.config import ALayout, KernelConfig  # noqa: E402
from nmgen.dispatch import default_dispatcher, problem_key  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch, measure  # noqa: E402
from nmgen.gpu.launch import Kernel, device_info  # noqa: E402
from nmgen.gpu.timing import time_in_turns  # noqa: E402
from nmgen.model import estimate, gpu_of_device_name, gpu_spec  # noqa: E402
from nmgen.refine import stream_k_twin as twin  # noqa: E402
from nmgen.space import Problem, core_config  # noqa: E402

RTOL = 1e-5
# The stream-K grid (blocks, whole tiles): launch's choice (as many blocks as fit, all
# full waves but the last whole), all full waves whole, or a block a tile (not persistent:
# the kernel's code with the hardware's scheduling of blocks).
def all_full_waves_whole(tiles: int, stages: int, resident: int) -> tuple[int, int]:
    blocks = min(resident, tiles * stages)
    return blocks, tiles // blocks * blocks


POLICIES = {
    "": launch.stream_k_grid,
    " (1 wave less shared)": all_full_waves_whole,
    " (a block a tile)": lambda tiles, stages, resident: (tiles, tiles),
}


def kernel_with(config: KernelConfig, policy: str) -> Kernel:
    """A kernel whose launch plan shares out stages by ``policy`` (its own source text,
    a comment apart, so that its plan is not another policy's)."""
    source = render(config)
    return Kernel(config, replace(source, code=source.code + f"// policy{policy}\n"))


def one(pattern: Pattern, layout: ALayout, shape: tuple[int, int, int], core: bool,
        rounds: int, lines: list[str]) -> None:
    rows, cols, depth = shape
    gpu = gpu_spec(gpu_of_device_name(device_info().name) or "h100")
    decision = default_dispatcher().decide(
        problem_key(pattern.n, pattern.m, 32, layout, rows, cols, depth))
    bases = [("tuned", decision.config)]
    if core:
        bases.append(("core", core_config(Problem(pattern.n, pattern.m, 32, layout,
                                                  device_info().arch))))
    a, b, out, ref = problem_inputs(pattern, layout, rows, cols, depth)
    fns, configs = {}, {}
    for label, base in bases:
        versions = [(label, base, "")] + [(f"{label} stream-K{policy}", twin(base), policy)
                                          for policy in POLICIES]
        for name, config, policy in versions:
            if config is None or name in fns or (base.stream_k and config is not base):
                continue
            kernel = Kernel(config) if not config.stream_k else kernel_with(config, policy)
            launch.stream_k_grid = POLICIES[policy]  # read when the plan is made
            try:
                err = measure.poisoned_error(lambda k=kernel: k(a, b, out=out), out, ref)
            finally:
                launch.stream_k_grid = POLICIES[""]
            if not err < RTOL:
                raise RuntimeError(f"{name} {config.name} is wrong on {rows}x{cols}x{depth}: "
                                   f"{err:.3g}")
            fns[name] = lambda i, k=kernel: k(a, b, out=out)
            configs[name] = config.name
    del ref
    times = time_in_turns(fns, rounds=rounds, repeat=10)
    for name, t in times.items():
        config = KernelConfig.from_name(configs[name])
        base = times[name.split(" stream-K")[0]]
        est = estimate(config, gpu, rows, cols, depth)
        lines.append(f"| {pattern.n}:{pattern.m} | {layout.value} | {rows}x{cols}x{depth} | "
                     f"{name} | `{config.name}` | {t:.4f} | {base / t:.3f} | "
                     f"{est.wave_efficiency:.2f} | {est.time_ms:.4f} |")
        print(lines[-1], flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="16:32,12:32,8:32,4:32")
    parser.add_argument("--layout", default="km", choices=[x.value for x in ALayout])
    parser.add_argument("--shape", action="append",
                        type=lambda s: tuple(int(x) for x in s.split(",")),
                        help="M,N,K (repeat the option for more)")
    parser.add_argument("--core", action="store_true",
                        help="also the hand-picked kernel of the core benchmark")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lines = [f"# Stream-K against the data-parallel grid ({device_info().name})", "",
             "| pattern | A | M x N x K | kernel | name | ms | speedup of stream-K | "
             "model wave eff. | model ms |", "|" + " --- |" * 9]
    for shape in args.shape or [(4096, 4096, 4096)]:
        for text in args.pattern.split(","):
            one(Pattern.parse(text), ALayout(args.layout), shape, args.core, args.rounds, lines)
            if args.out:
                args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
