"""Does a programmatic dependent launch start early on this GPU? A probe.

A primary kernel of small blocks (one an SM) spins for ``--spin-us`` on the GPU clock,
after ``griddepcontrol.launch_dependents`` at its top (or without it); the secondary,
launched after it on the same stream with the programmatic-stream-serialization
attribute (``pdl_ab.launch_pdl``) or as usual, notes its first block's start. Both note
%globaltimer; printed in us from the primary's first block start, medians of ``--calls``:

  secondary start     its first block's start: before the primary's end only if the
                      dependent launch started early,
  after wait          its first block past ``griddepcontrol.wait``.

Run on streams of the default and of the greatest priority, since the launcher's
pipeline streams have the greatest; and with an event recorded between the two launches,
as the launcher records copy 0's end (for copy 1) before main kernel 0.

    python tools/pdl_probe.py --calls 9
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from pdl_ab import launch_pdl  # noqa: E402

from nmgen.gpu import launch  # noqa: E402

SOURCE = r"""
__device__ unsigned long long probe_times[4];  // primary start, end; secondary start, past wait

__device__ __forceinline__ unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void primary(unsigned long long spin_ns, int trigger) {
    if (trigger) asm volatile("griddepcontrol.launch_dependents;");
    const unsigned long long start = now();
    if (threadIdx.x == 0) atomicMin(probe_times, start);
    while (now() - start < spin_ns) {}
    if (threadIdx.x == 0) atomicMax(probe_times + 1, now());
}

extern "C" __global__ void secondary() {
    if (threadIdx.x == 0) atomicMin(probe_times + 2, now());
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0) atomicMin(probe_times + 3, now());
}
"""


_COOPERATIVE = 2  # CU_LAUNCH_ATTRIBUTE_COOPERATIVE


def launch_ex(function, grid: int, threads: int, params, stream_ptr: int,
              attribute: int | None = None) -> int:
    """cuLaunchKernelEx, packed as the launcher packs it, with no attribute or one set to
    1; its CUresult."""
    attrs, count = None, 0
    if attribute is not None:
        attr = launch._LaunchAttribute(id=attribute)
        attr.value[0] = 1
        attrs, count = ctypes.pointer(attr), 1
    config = launch._LaunchConfig((ctypes.c_uint * 3)(grid, 1, 1),
                                  (ctypes.c_uint * 3)(threads, 1, 1), 0,
                                  ctypes.c_void_p(stream_ptr), attrs, count)
    return launch._launch_kernel_ex()(ctypes.byref(config), ctypes.c_void_p(function.ptr),
                                      ctypes.c_void_p(ctypes.addressof(params)), None)


def attributes_read(module, stream) -> str:
    """Whether cuLaunchKernelEx reads the attributes as this module packs them: a
    cooperative launch of more blocks than fit at once must be refused."""
    params = (ctypes.c_void_p * 2)()
    spin, trig = ctypes.c_uint64(0), ctypes.c_int32(0)
    params[0], params[1] = ctypes.addressof(spin), ctypes.addressof(trig)
    blocks = 64 * launch.device_info().sms
    status = launch_ex(module.get_function("primary").kernel, blocks, 1024, params, stream.ptr,
                       _COOPERATIVE)
    launch._cupy().cuda.Device().synchronize()
    return f"cooperative launch of {blocks} blocks of 1024 threads: CUresult {status}"


def one_call(module, times, stream, spin_ns: int, trigger: bool, pdl: bool,
             primary_ex: bool = False, event_between: bool = False) -> np.ndarray:
    """(primary end, secondary start, secondary past its wait) in us from the primary's
    start, in one call."""
    cp = launch._cupy()
    sms = launch.device_info().sms
    cp.cuda.Device().synchronize()
    times[:] = cp.asarray(np.array([2**64 - 1, 0, 2**64 - 1, 2**64 - 1], np.uint64))
    launch._wait_kernel()((1,), (1,), (np.uint64(100_000),), stream=stream)  # host queues first
    primary = module.get_function("primary")
    if primary_ex:  # the primary through cuLaunchKernelEx too, without attributes
        spin, trig = ctypes.c_uint64(spin_ns), ctypes.c_int32(trigger)
        params = (ctypes.c_void_p * 2)(ctypes.addressof(spin), ctypes.addressof(trig))
        assert launch_ex(primary.kernel, sms, 128, params, stream.ptr) == 0
    else:
        primary((sms,), (128,), (np.uint64(spin_ns), np.int32(trigger)), stream=stream)
    if event_between:  # as the launcher records copy 0's end before main kernel 0
        launch._record(stream)
    secondary = module.get_function("secondary")
    if pdl:
        launch_pdl(secondary.kernel, (sms, 1, 1), 128, 0, (ctypes.c_void_p * 1)(), stream.ptr)
    else:
        secondary((sms,), (128,), (), stream=stream)
    cp.cuda.Device().synchronize()
    t = times.get().astype(np.int64)
    return (t[1:] - t[0]) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=9)
    parser.add_argument("--spin-us", type=float, default=20.0)
    args = parser.parse_args()
    cp = launch._cupy()
    module = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    times = cp.ndarray((4,), cp.uint64, memptr=module.get_global("probe_times"))
    greatest = launch._priority_range()[1]
    print(f"# PDL probe ({launch.device_info().name}), primary spins {args.spin_us} us\n")
    print("| stream priority | primary triggers | secondary launch | primary end us "
          "| secondary start us | after wait us |")
    print("| --- | --- | --- | --- | --- | --- |")
    def row(label: str, stream, trigger: bool, pdl: bool, **how) -> None:
        runs = np.array([one_call(module, times, stream, int(1000 * args.spin_us), trigger,
                                  pdl, **how) for _ in range(args.calls)])
        end, start, past = np.median(runs, axis=0)
        print(f"| {label} | {'yes' if trigger else 'no'} | {'PDL' if pdl else 'as usual'} "
              f"| {end:.1f} | {start:.1f} | {past:.1f} |", flush=True)

    for label, priority in (("default", 0), ("greatest", greatest)):
        stream = cp.cuda.Stream(non_blocking=True, priority=priority)
        for trigger in (True, False):
            for pdl in (True, False):
                row(label, stream, trigger, pdl)
    stream = cp.cuda.Stream(non_blocking=True)
    row("default, primary by cuLaunchKernelEx", stream, True, True, primary_ex=True)
    for trigger in (True, False):
        row("default, an event recorded between", stream, trigger, True, event_between=True)
    print(f"\n{attributes_read(module, stream)}")


if __name__ == "__main__":
    main()
