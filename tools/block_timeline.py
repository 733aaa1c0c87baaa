"""Where a pipelined row-major launch loses time against K-major A, block by block: every
block of the core kernels records, on the GPU, its SM and its start and end (%globaltimer),
so that the idle block slots and the slower blocks can be told apart.

The probe is a variant of the kernels' source (a record written by thread 0 of each
block as it leaves the kernel); the launches are the library's own (``Kernel``), checked
against float64 first. For the K-major kernel and the shipped row-major pipeline, per
call (medians over ``--calls``):

  span          first block start to last block end, us;
  main slot-us  the main blocks' durations summed, over the span times the block slots
                (resident main blocks an SM times the SMs): how busy the slots were;
  idle start    us from the first block (any kernel) to the first main block;
  main block    median and 90th percentile of a main block's duration, us, on SMs that
                ran a copy block during it and on the others.

    python tools/block_timeline.py --pattern 4:32,8:32 --calls 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _ab import at_kernel_entry, checked_ratios, compiled_module, problem_inputs  # noqa: E402

from nmgen.codegen import KernelSource, render  # noqa: E402
from nmgen.config import ALayout  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.space import Problem, core_config  # noqa: E402

RECORDS = 1 << 16
PROBE = r"""
// block_timeline.py's probe: thread 0 of each block records (start, end, SM, tag, pointer)
__device__ unsigned long long nmgen_probe[RECORDS * 4];
__device__ unsigned int nmgen_probe_count;
struct NmgenProbe {  // the start waits in shared memory: no register held across the kernel
    unsigned long long tag;
    const void* ptr;
    __device__ static unsigned long long& start() {
        __shared__ unsigned long long value;
        return value;
    }
    __device__ NmgenProbe(unsigned long long tag_, const void* ptr_) : tag(tag_), ptr(ptr_) {
        if (threadIdx.x == 0) asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(start()));
    }
    __device__ ~NmgenProbe() {
        if (threadIdx.x != 0) return;
        unsigned long long end;
        unsigned int sm;
        asm volatile("mov.u64 %%0, %%%%globaltimer;" : "=l"(end));
        asm volatile("mov.u32 %%0, %%%%smid;" : "=r"(sm));
        const unsigned int slot = atomicAdd(&nmgen_probe_count, 1u);
        if (slot >= RECORDS) return;
        nmgen_probe[4 * slot] = start();
        nmgen_probe[4 * slot + 1] = end;
        nmgen_probe[4 * slot + 2] = (unsigned long long)sm << 32 | tag;
        nmgen_probe[4 * slot + 3] = reinterpret_cast<unsigned long long>(ptr);
    }
};
""".replace("RECORDS", str(RECORDS)).replace("%%", "%")
MAIN_TAG, COPY_TAG = 0, 1
QUEUE_AHEAD_NS = 300_000


def launches(records: np.ndarray) -> list[str]:
    """A table row for each launch of one call (told apart by kind and pointer), in the
    order of their first block: blocks, first and last start, first and last end, median
    block duration, us from the call's first block."""
    t0 = records[:, 0].min()
    rows = []
    for tag, ptr in {(int(r[3]), int(r[4])) for r in records}:
        own = records[(records[:, 3] == tag) & (records[:, 4] == ptr)]
        us = (own[:, :2] - t0) / 1e3
        rows.append((us[:, 0].min(), f"| {'main' if tag == MAIN_TAG else 'copy'} | {len(own)} "
                     f"| {us[:, 0].min():.1f} - {us[:, 0].max():.1f} "
                     f"| {us[:, 1].min():.1f} - {us[:, 1].max():.1f} "
                     f"| {np.median(us[:, 1] - us[:, 0]):.1f} |"))
    return [row for _, row in sorted(rows)]


def probed(source: KernelSource) -> KernelSource:
    """``source`` with the probe at the top of its main and transpose kernels."""
    return at_kernel_entry(source, f"NmgenProbe nmgen_guard({MAIN_TAG}, C);",
                           f"NmgenProbe nmgen_guard({COPY_TAG}, A);", PROBE)


class Recorder:
    """The probe buffer of the module a ``Kernel`` launches from (captured as it is
    compiled)."""

    def __init__(self, kernel) -> None:
        import cupy as cp

        module = compiled_module(kernel)
        self.buffer = cp.ndarray((4 * RECORDS,), cp.uint64,
                                 memptr=module.get_global("nmgen_probe"))
        self.count = cp.ndarray((1,), cp.uint32, memptr=module.get_global("nmgen_probe_count"))

    def run(self, call) -> np.ndarray:
        """Records of one ``call()``: rows (start ns, end ns, SM, tag, pointer)."""
        import cupy as cp

        from nmgen.gpu.launch import _wait_kernel

        cp.cuda.Device().synchronize()
        self.count.fill(0)
        _wait_kernel()((1,), (1,), (np.uint64(QUEUE_AHEAD_NS),))  # the host path stays out
        call()
        cp.cuda.Device().synchronize()
        n = min(int(self.count.get()[0]), RECORDS)
        raw = self.buffer[: 4 * n].get().reshape(n, 4)
        return np.stack([raw[:, 0], raw[:, 1], raw[:, 2] >> np.uint64(32),
                         raw[:, 2] & np.uint64(0xFFFFFFFF), raw[:, 3]], axis=1).astype(np.int64)


def main_blocks_by_company(records: np.ndarray) -> list[str]:
    """For each main launch of one call's records, in order: its blocks that shared their
    SM with a copy block at some time, and the others (most with a second main block
    beside them the whole time), as count and median duration (us)."""
    main, copies = records[records[:, 3] == MAIN_TAG], records[records[:, 3] == COPY_TAG]
    rows = ["| main launch | blocks beside a copy | median us | other blocks | median us |",
            "| --- | --- | --- | --- | --- |"]
    ptrs = sorted(set(main[:, 4].tolist()), key=lambda p: main[main[:, 4] == p][:, 0].min())
    for j, ptr in enumerate(ptrs):
        beside, alone = [], []
        for start, end, sm, _, _ in main[main[:, 4] == ptr]:
            on_sm = copies[(copies[:, 2] == sm) & (copies[:, 0] < end) & (copies[:, 1] > start)]
            (beside if len(on_sm) else alone).append((end - start) / 1e3)
        med = [f"{np.median(v):.1f}" if v else "-" for v in (beside, alone)]
        rows.append(f"| {j} | {len(beside)} | {med[0]} | {len(alone)} | {med[1]} |")
    return rows


def summary(records: np.ndarray, slots: int) -> dict:
    """The figures of the module docstring for one call's records (times in us)."""
    start, end, sm, tag = (records[:, i] for i in range(4))
    t0 = start.min()
    main = tag == MAIN_TAG
    copies = records[~main]
    duration = (end - start) / 1e3
    span = (end.max() - t0) / 1e3
    beside = np.zeros(main.sum(), bool)
    for i, (s, e, m) in enumerate(zip(start[main], end[main], sm[main], strict=True)):
        on_sm = copies[copies[:, 2] == m]
        beside[i] = bool(np.any((on_sm[:, 0] < e) & (on_sm[:, 1] > s)))
    main_d = duration[main]

    def pct(v: np.ndarray, q: float) -> float:
        return float(np.percentile(v, q)) if v.size else float("nan")

    return {"span": span, "busy": main_d.sum() / (span * slots),
            "idle_start": (start[main].min() - t0) / 1e3,
            "beside_med": pct(main_d[beside], 50), "beside_p90": pct(main_d[beside], 90),
            "beside_n": int(beside.sum()),
            "alone_med": pct(main_d[~beside], 50), "alone_p90": pct(main_d[~beside], 90),
            "last_main_start": (start[main].max() - t0) / 1e3,
            "copy_end": (copies[:, 1].max() - t0) / 1e3 if copies.size else float("nan")}


def one(pattern: Pattern, size: int, calls: int, rounds: int, folder: Path | None
        ) -> list[str]:
    from nmgen.gpu.launch import Kernel, device_info

    arch = device_info().arch
    a, b, out, ref = problem_inputs(pattern, ALayout.ROW_MAJOR, size, size, size)
    import cupy as cp

    a_km = cp.ascontiguousarray(a.T).T
    kernels = {}
    for layout in (ALayout.K_MAJOR, ALayout.ROW_MAJOR):
        config = core_config(Problem(pattern.n, pattern.m, 32, layout, arch))
        kernels[layout] = Kernel(config, probed(render(config)))
    km, tx = kernels[ALayout.K_MAJOR], kernels[ALayout.ROW_MAJOR]
    recorders = {km: Recorder(km), tx: Recorder(tx)}  # before anything compiles them
    fns = {f"km {km.name}": lambda i: km(a_km, b, out=out),
           f"tx {tx.name}": lambda i: tx(a, b, out=out)}
    lines = checked_ratios(fns, out, ref, f"{pattern.n}:{pattern.m} (probed)", rounds, 300)
    slots = device_info().sms * tx_blocks_per_sm(km)
    lines += ["", f"block slots: {slots}", "",
              "| kernel | span us | main slot-us busy | idle start us | last main start us "
              "| copies end us | main block beside a copy: n, median, p90 us "
              "| main block alone: median, p90 us |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    detail = []
    for label, kernel, call in (("km", km, fns[f"km {km.name}"]),
                                ("tx pipelined", tx, fns[f"tx {tx.name}"])):
        recorder = recorders[kernel]
        rows = [summary(recorder.run(lambda call=call: call(0)), slots) for _ in range(calls)]
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        lines.append(f"| {label} | {med['span']:.1f} | {med['busy']:.3f} | "
                     f"{med['idle_start']:.1f} | {med['last_main_start']:.1f} | "
                     f"{med['copy_end']:.1f} | {med['beside_n']:.0f}, {med['beside_med']:.1f}, "
                     f"{med['beside_p90']:.1f} | {med['alone_med']:.1f}, "
                     f"{med['alone_p90']:.1f} |")
        print(lines[-1], flush=True)
        records = recorder.run(lambda call=call: call(0))
        if folder:
            np.save(folder / f"blocks_{pattern.n}_{pattern.m}_{label.split()[0]}.npy", records)
        detail += ["", f"### {pattern.n}:{pattern.m} {label}: one call's launches", "",
                   "| kernel | blocks | starts us | ends us | median block us |",
                   "| --- | --- | --- | --- | --- |", *launches(records)]
    lines += detail
    return lines


def tx_blocks_per_sm(kernel) -> int:
    """Resident main blocks an SM, from the occupancy calculator."""
    import cupy as cp

    main, _, _ = kernel._compiled(cp.cuda.runtime.getDevice())
    return cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
        main.ptr, kernel.config.threads, kernel.config.smem_bytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="4:32,8:32")
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--records", type=Path, nargs="*",
                        help="instead: the main blocks of saved records (blocks_*.npy) by "
                             "company, no GPU needed")
    args = parser.parse_args()
    if args.records:
        for path in args.records:
            print(f"\n{path.name}\n")
            print("\n".join(main_blocks_by_company(np.load(path))))
        return
    from nmgen.gpu.launch import device_info

    lines = [f"# Block timeline ({device_info().name}, M = N = K = {args.size})", ""]
    for text in args.pattern.split(","):
        lines += ["", f"## {text}", "", "| pattern | version | ms | over km |",
                  "| --- | --- | --- | --- |"]
        lines += one(Pattern.parse(text), args.size, args.calls, args.rounds,
                     args.out.parent if args.out else None)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
