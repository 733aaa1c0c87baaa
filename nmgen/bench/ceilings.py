"""The device's own ceilings for the roofline: FP32 FFMA throughput and DRAM bandwidth,
measured here rather than taken from the datasheet (clocks and parts differ)."""

from __future__ import annotations

from dataclasses import dataclass

from ..compiler.nvrtc import cupy
from ..runtime.device import device_info

CHAINS = 8  # independent FMA chains a thread: hides the FFMA latency
UNROLL = 16

# Every thread runs CHAINS dependent FMA chains; the result is stored so that the compiler
# cannot drop the loop.
FFMA_SOURCE = f"#define CHAINS {CHAINS}\n#define UNROLL {UNROLL}\n" + r"""
extern "C" __global__ void nmgen_ffma_peak(float* out, int iters, float a, float b) {
    float x[CHAINS];
    #pragma unroll
    for (int c = 0; c < CHAINS; ++c) x[c] = threadIdx.x * 1e-3f + c;
    for (int i = 0; i < iters; ++i) {
        #pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            #pragma unroll
            for (int c = 0; c < CHAINS; ++c) x[c] = fmaf(x[c], a, b);
        }
    }
    float sum = 0.f;
    #pragma unroll
    for (int c = 0; c < CHAINS; ++c) sum += x[c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
"""


@dataclass(frozen=True)
class Ceilings:
    fp32_tflops: float
    dram_gbs: float
    device_name: str


def _best_ms(fn, repeat: int) -> float:
    cp = cupy()
    fn()
    best = float("inf")
    for _ in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, stop))
    return best


def fp32_peak_tflops(repeat: int = 5) -> float:
    cp = cupy()
    kernel = cp.RawKernel(FFMA_SOURCE, "nmgen_ffma_peak")
    threads, blocks = 256, device_info().sms * 8
    iters = 4096
    out = cp.empty(threads * blocks, cp.float32)
    ms = _best_ms(lambda: kernel((blocks,), (threads,),
                                 (out, cp.int32(iters), cp.float32(0.999), cp.float32(1e-3))),
                  repeat)
    flops = 2.0 * CHAINS * UNROLL * iters * threads * blocks
    return flops / ms / 1e9


def dram_gbs(nbytes: int = 1 << 30, repeat: int = 5) -> float:
    """Device-to-device copy: every byte read once and written once."""
    cp = cupy()
    src = cp.ones(nbytes // 4, cp.float32)
    dst = cp.empty_like(src)
    runtime = cp.cuda.runtime

    def copy() -> None:
        runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes,
                            runtime.memcpyDeviceToDevice, cp.cuda.get_current_stream().ptr)

    ms = _best_ms(copy, repeat)
    return 2.0 * nbytes / ms / 1e6


def measure_ceilings() -> Ceilings:
    return Ceilings(fp32_peak_tflops(), dram_gbs(), device_info().name)
