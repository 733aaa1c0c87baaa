"""Row-major A in M chunks: the shipped pipelined copy against one copy, and other plans.

A `tx` kernel copies row-major A K-major (read A, write the copy) and runs the K-major
kernel on the copy. The launcher pipelines that in chunks of M (nmgen.copy_plan; chunk j's
copy overlaps chunk j-1's main kernel). Times, in turns in one process, each checked
against float64 first:
  km           the K-major kernel on A already K-major (the bound),
  tx           the row-major kernel on all of A, as shipped (pipelined where it pays),
  tx one copy  the same with Kernel.pipeline_copy off: one copy of A, one main kernel,
  tx plan P    the shipped pipeline over the chunks of plan P (--plans: C for chunks of
               C rows, or C1+C2+... in order),
  tx/C         the kernel called on chunks of C rows one after another (--sequential),
  tx mains only, tx copies only  the shipped pipeline with its copies, or its main
               kernels, left out (--halves; timing only, wrong output),
  km cap R, tx cap R  (--caps R) the main kernels with their registers capped at R and
               the copy in blocks of 128 threads, so that a copy block fits on an SM beside
               two main blocks (co-resident) instead of waiting for a slot; with
               --carveout they ask for the largest shared-memory carveout,
  tx hints L/S, tx one copy, hints L/S  (--copy-hints L/S) the transpose's loads and
               stores under the L2 eviction policies L and S (first, last, normal, none).

    python tools/chunked_tx_ab.py --pattern 16:32,12:32,8:32,4:32 --rounds 9 \
        --out results/chunked_tx_h100/core_pipelined2.md

The session-25 prototype of the pipeline made of separate calls (txp: register caps,
three workspaces, its halves timed alone; results/chunked_tx_h100/pipelined*.md) is this
file as of commit 96ae1a3.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nmgen.codegen import KernelSource, render_text  # noqa: E402
from nmgen.config import ALayout  # noqa: E402
from nmgen.format import Pattern  # noqa: E402
from nmgen.gpu import launch, measure  # noqa: E402
from nmgen.gpu.bench import dense_float64, random_weight  # noqa: E402
from nmgen.gpu.launch import Kernel, LaunchPlan, _cupy, device_info, operand  # noqa: E402
from nmgen.gpu.timing import QUEUE_AHEAD_US, time_in_turns  # noqa: E402
from nmgen.space import Problem, core_config  # noqa: E402

RTOL = 1e-5

# --copy-hints: L2 eviction policies on the transpose's loads of A (read once) and stores
# of the K-major copy (read next by the main kernel), through createpolicy (sm_80+).
HINT_HELPERS = r"""{% raw %}
template <int POLICY> __device__ __forceinline__ unsigned long long l2_policy() {
    unsigned long long p;
    if (POLICY == 0)
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    else if (POLICY == 1)
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    else
        asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
    return p;
}
template <int POLICY> __device__ __forceinline__ float4 load_hinted(const float* src) {
    float4 v;
    asm volatile("ld.global.nc.L2::cache_hint.v4.f32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(src), "l"(l2_policy<POLICY>()));
    return v;
}
template <int POLICY> __device__ __forceinline__ void store_hinted(float* dst, float4 v) {
    asm volatile("st.global.L2::cache_hint.v4.f32 [%0], {%1, %2, %3, %4}, %5;"
                 :: "l"(dst), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "l"(l2_policy<POLICY>())
                 : "memory");
}
{% endraw %}"""
POLICIES = {"first": 0, "last": 1, "normal": 2, "none": -1}
CORESIDENT_COPY_THREADS = 128  # 24 registers each: 3072 beside two capped main blocks


def with_chunks(tx: Kernel, a, b, out, plan: list[int]):
    """The shipped pipeline (Kernel._run_pipelined) over the chunks of ``plan`` instead of
    nmgen.copy_plan's: the call sets them on the launch plan it is about to use."""
    launch_plan = tx._cached_plan(b, operand(a, "a"), a.shape[0], a.shape[1])
    shipped = launch_plan.chunks  # the plan is shared with the "tx" version: put it back

    def call(i: int) -> None:
        launch_plan.chunks = plan
        try:
            tx(a, b, out=out)
        finally:
            launch_plan.chunks = shipped
    return call


def without(method: str, call):
    """``call`` with ``LaunchPlan.<method>`` a no-op (timing only: the output is wrong).
    Inside the shipped pipeline, "launch_copy_a" leaves its main kernels on their streams
    and events, "launch" its copies: where a pipelined launch's time goes."""
    def timed(i: int) -> None:
        original = getattr(LaunchPlan, method)
        setattr(LaunchPlan, method, lambda self, *args: None)
        try:
            call(i)
        finally:
            setattr(LaunchPlan, method, original)
    return timed


def coresident(config, registers: int, copy_threads: int) -> tuple[Kernel, Kernel]:
    """(tx kernel, its K-major twin) with the main kernels' registers capped
    (``__maxnreg__`` instead of the launch bounds) and the transpose in blocks of
    ``copy_threads``: small enough that a copy block fits on an SM beside two main blocks,
    so that chunk j+1's copy can run while chunk j's main kernel holds every block slot."""
    import nmgen.codegen as codegen

    shipped = codegen.COPY_A_THREADS
    codegen.COPY_A_THREADS = copy_threads
    try:  # render_text: render() keeps what it rendered with the shipped block size
        template = codegen.template_text(config.family)
        sources = [render_text(c, template)
                   for c in (config, config.replace(a_layout="km", a_tile="tk"))]
    finally:
        codegen.COPY_A_THREADS = shipped
    if f"__launch_bounds__({copy_threads})" not in sources[0].code:
        raise RuntimeError("the transpose was not rendered for the new block size")
    kernels = []
    for source in sources:
        code, count = re.subn(r"__launch_bounds__\(THREADS, \d+\)",
                              f"__maxnreg__({registers})", source.code)
        if count != 1:
            raise RuntimeError(f"{source.name}: no launch bounds to replace")
        kernels.append(Kernel(source.config, KernelSource(source.config, code)))
    return kernels[0], kernels[1]


def hinted(config, load: str, store: str) -> Kernel:
    """The tx kernel with its transpose's 16-byte loads and stores under the L2 eviction
    policies ``load`` and ``store`` (first, last, normal; none: as shipped)."""
    import nmgen.codegen as codegen

    template = codegen.template_text(config.family)
    plain_load = "__ldg(reinterpret_cast<const float4*>(src))"
    plain_store = "*reinterpret_cast<float4*>(AT + k * ld + m) = make_float4("
    for text in (plain_load, plain_store, "// Row-major A (M x K, lda) copied K-major"):
        if template.count(text) != 1:
            raise RuntimeError(f"the template no longer holds {text!r} once")
    if POLICIES[load] >= 0:
        template = template.replace(plain_load, f"load_hinted<{POLICIES[load]}>(src)")
    if POLICIES[store] >= 0:
        template = re.sub(r"\*reinterpret_cast<float4\*>\(AT \+ k \* ld \+ m\) = make_float4\("
                          r"([^;]*)\);",
                          lambda mt: f"store_hinted<{POLICIES[store]}>(AT + k * ld + m, "
                                     f"make_float4({mt.group(1)}));", template)
    template = template.replace("// Row-major A (M x K, lda) copied K-major",
                                HINT_HELPERS + "\n// Row-major A (M x K, lda) copied K-major")
    source = render_text(config, template)
    return Kernel(source.config, KernelSource(source.config, source.code))


CARVEOUT_ATTRIBUTE, MAX_SHARED = 9, 100  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT


def prefer_shared(kernel: Kernel) -> None:
    """Every function of ``kernel`` asks for the SM's largest shared-memory carveout, so
    that an SM running two capped main blocks keeps room for a copy block's tile (the
    driver otherwise picks the smallest carveout that holds the main blocks)."""
    cp = _cupy()
    for function in kernel._compiled(cp.cuda.Device().id):
        if function is not None:
            cp.cuda.driver.funcSetAttribute(function.ptr, CARVEOUT_ATTRIBUTE, MAX_SHARED)


def with_copy_threads(copy_threads: int, call):
    """``call`` with the launcher's transpose launches in blocks of ``copy_threads``."""
    def timed(i: int) -> None:
        shipped = launch.COPY_A_THREADS
        launch.COPY_A_THREADS = copy_threads
        try:
            call(i)
        finally:
            launch.COPY_A_THREADS = shipped
    return timed


def variants(pattern: Pattern, a, b, out, plans: list[list[int]], sequential: list[int],
             halves: bool, caps: list[int], hints: list[str] = (),
             carveout: bool = False) -> dict:
    """name -> call(i) of every version timed; all write ``out``."""
    cp = _cupy()
    arch = device_info().arch
    km = Kernel(core_config(Problem(pattern.n, pattern.m, 32, ALayout.K_MAJOR, arch)))
    tx = Kernel(core_config(Problem(pattern.n, pattern.m, 32, ALayout.ROW_MAJOR, arch)))
    single = Kernel(tx.config)
    single.pipeline_copy = False  # one copy of all of A, then one main kernel
    a_km = cp.ascontiguousarray(a.T).T  # the same values, K-major
    rows = a.shape[0]

    def chunked(size: int):
        def call(i: int) -> None:
            for r0 in range(0, rows, size):
                tx(a[r0:r0 + size], b, out=out[r0:r0 + size])
        return call

    fns = {f"km {km.name}": lambda i: km(a_km, b, out=out),
           f"tx {tx.name}": lambda i: tx(a, b, out=out),
           "tx one copy": lambda i: single(a, b, out=out)}
    fns.update({f"tx plan {plan_label(plan)}": with_chunks(tx, a, b, out, plan)
                for plan in plans})
    fns.update({f"tx/{size}": chunked(size) for size in sequential if size < rows})
    if halves:
        fns["tx mains only (wrong)"] = without("launch_copy_a", fns[f"tx {tx.name}"])
        fns["tx copies only (wrong)"] = without("launch", fns[f"tx {tx.name}"])
    for hint in hints:
        load, store = hint.split("/")
        k = hinted(tx.config, load, store)
        fns[f"tx hints load {load} store {store}"] = lambda i, k=k: k(a, b, out=out)
        k1 = hinted(tx.config, load, store)
        k1.pipeline_copy = False
        fns[f"tx one copy, hints {load}/{store}"] = lambda i, k=k1: k(a, b, out=out)
    for cap in caps:
        capped_tx, capped_km = coresident(tx.config, cap, CORESIDENT_COPY_THREADS)
        if carveout:
            for kernel in (capped_tx, capped_km):
                prefer_shared(kernel)
        fns[f"km cap {cap}"] = lambda i, k=capped_km: k(a_km, b, out=out)
        fns[f"tx cap {cap}, copy {CORESIDENT_COPY_THREADS} threads"] = with_copy_threads(
            CORESIDENT_COPY_THREADS, lambda i, k=capped_tx: k(a, b, out=out))
    return fns


def plan_label(plan: list[int]) -> str:
    return str(plan[0]) if len(set(plan)) == 1 else "+".join(map(str, plan))


def one(pattern: Pattern, shape: tuple[int, int, int], args: argparse.Namespace,
        lines: list[str]) -> None:
    cp = _cupy()
    rows, cols, depth = shape
    a = cp.random.standard_normal((rows, depth), dtype=cp.float32)
    b = random_weight(pattern.n, pattern.m, 32, depth, cols)
    out = cp.full((rows, cols), cp.nan, cp.float32)
    ref = a.astype(cp.float64) @ dense_float64(b)
    fns = variants(pattern, a, b, out, parse_plans(args.plans, rows), args.sequential,
                   args.halves, args.caps, args.copy_hints, args.carveout)
    for name, fn in fns.items():
        if name.endswith("(wrong)"):
            continue
        err = measure.poisoned_error(lambda fn=fn: fn(0), out, ref)
        if not err < RTOL:
            raise RuntimeError(f"{name} is wrong on {rows}x{cols}x{depth}: {err:.3g}")
    del ref
    if args.halves:  # where the pipeline's two workspaces landed (the pool picks)
        spaces = set()
        original = LaunchPlan.launch_copy_a
        LaunchPlan.launch_copy_a = lambda self, a_ptr, copy_ptr, stream_ptr: (
            spaces.add(copy_ptr), original(self, a_ptr, copy_ptr, stream_ptr))
        try:
            fns[next(name for name in fns if name.startswith("tx nm_"))](0)
        finally:
            LaunchPlan.launch_copy_a = original
        print("workspaces:", ", ".join(f"{p:#x} (mod 2 MiB {p % (2 << 20):#x})"
                                       for p in sorted(spaces)), flush=True)
    times = time_in_turns(fns, rounds=args.rounds, repeat=10,
                          queue_ahead_us=args.queue_ahead_us)
    if args.host:
        for name in (n for n in fns if n.startswith("tx ") and "(wrong)" not in n):
            print(f"host {name[:40]}: {host_us(fns[name]):.1f} us a call", flush=True)
    bound = next(t for name, t in times.items() if name.startswith("km "))
    for name, t in times.items():
        lines.append(f"| {pattern.n}:{pattern.m} | {rows}x{cols}x{depth} | {name} | "
                     f"{t:.4f} | {t / bound:.3f} |")
        print(lines[-1], flush=True)


def host_us(fn, calls: int = 50) -> float:
    """Median host microseconds of a call (the launches, not the GPU's work)."""
    cp = _cupy()
    spent = []
    for i in range(calls):
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        fn(i)
        spent.append((time.perf_counter() - start) * 1e6)
    cp.cuda.Device().synchronize()
    return statistics.median(spent)


def parse_plans(text: str, rows: int) -> list[list[int]]:
    """The --plans for ``rows`` rows; a plan must cover them exactly."""
    plans = []
    for item in filter(None, text.split(",")):
        plan = [int(x) for x in item.split("+")]
        if len(plan) == 1 and plan[0] < rows and rows % plan[0] == 0:
            plan = plan * (rows // plan[0])
        if sum(plan) == rows and len(plan) > 1:
            plans.append(plan)
    return plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pattern", default="4:32,8:32")
    parser.add_argument("--shape", action="append",
                        type=lambda s: tuple(int(x) for x in s.split(",")),
                        help="M,N,K (repeat the option for more)")
    parser.add_argument("--plans", default="",
                        help="plans for the shipped pipeline, comma-separated: C or C1+C2+...")
    parser.add_argument("--sequential", default=[], type=lambda s: [int(x) for x in s.split(",")],
                        help="chunk rows C for tx/C: chunks one after another on one stream")
    parser.add_argument("--halves", action="store_true",
                        help="also the shipped pipeline without its copies, and without "
                             "its main kernels (timing only)")
    parser.add_argument("--caps", default=[], type=lambda s: [int(x) for x in s.split(",")],
                        help="register caps of co-resident variants: the main kernels capped, "
                             "the copy in blocks a capped SM still has room for")
    parser.add_argument("--carveout", action="store_true",
                        help="--caps kernels ask for the largest shared-memory carveout")
    parser.add_argument("--copy-hints", default=[], type=lambda s: s.split(","),
                        help="LOAD/STORE L2 policies of the transpose (first, last, normal, "
                             "none), comma-separated: e.g. first/last")
    parser.add_argument("--queue-ahead-us", type=float, default=QUEUE_AHEAD_US,
                        help="GPU wait queued before each timed call (hides the host path)")
    parser.add_argument("--equal-priority", action="store_true",
                        help="the pipeline's copy stream at the main streams' priority")
    parser.add_argument("--host", action="store_true",
                        help="also the host time of a tx call (median of 50)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.equal_priority:  # before the first pipelined call makes the streams
        launch._priority_range = lambda: (0, 0)
    lines = [f"# Row-major A in M chunks ({device_info().name})", "",
             "| pattern | M x N x K | version | ms | over km |", "| --- | --- | --- | --- | --- |"]
    for shape in args.shape or [(4096, 4096, 4096)]:
        for text in args.pattern.split(","):
            one(Pattern.parse(text), shape, args, lines)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
