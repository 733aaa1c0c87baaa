"""The GPUs nmgen knows: compile targets and datasheet figures.

The figures feed the families' analytic models; ``nmgen bench`` measures the ceilings on
the device itself. A device missing from the table still runs (its name keys its tuned
records); the model then borrows the H100's figures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

REGISTERS_PER_SM = 65536
SMEM_PER_SM = {80: 164 * 1024, 86: 100 * 1024, 89: 100 * 1024, 90: 228 * 1024}


class Arch(str, Enum):
    """A compile target (``-arch``)."""

    SM80 = "sm_80"
    SM86 = "sm_86"
    SM89 = "sm_89"
    SM90 = "sm_90"

    @property
    def number(self) -> int:
        return int(self.value[3:])

    @property
    def max_smem_per_block(self) -> int:
        """Opt-in dynamic shared memory per block, in bytes."""
        return {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}[self.number]


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet figures of one GPU."""

    name: str
    arch: Arch
    sms: int
    max_threads_per_sm: int
    peak_fp32_tflops: float  # at boost clock
    dram_gbs: float
    l2_mb: float

    @property
    def smem_per_sm(self) -> int:
        return SMEM_PER_SM[self.arch.number]

    @property
    def l2_gbs(self) -> float:
        """L2 → SM bandwidth, taken as a multiple of DRAM bandwidth (about 2.5× on A100
        and H100 microbenchmarks)."""
        return 2.5 * self.dram_gbs


GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    GpuSpec("a100", Arch.SM80, 108, 2048, 19.5, 2039, 40),
    GpuSpec("a10", Arch.SM86, 72, 1536, 31.2, 600, 6),
    GpuSpec("rtx3090", Arch.SM86, 82, 1536, 35.6, 936, 6),
    GpuSpec("l4", Arch.SM89, 58, 1536, 30.3, 300, 48),
    GpuSpec("l40s", Arch.SM89, 142, 1536, 91.6, 864, 96),
    GpuSpec("rtx4090", Arch.SM89, 128, 1536, 82.6, 1008, 72),
    GpuSpec("h100", Arch.SM90, 132, 2048, 66.9, 3350, 50),
    GpuSpec("h200", Arch.SM90, 132, 2048, 66.9, 4800, 60),
)}

# Dense BF16/FP16 tensor-core peak (TFLOP/s, FP32 accumulation; datasheet) by GPU; others
# are taken as DENSE_TENSOR_OVER_FP32 times their FP32 peak.
DENSE_TENSOR_TFLOPS = {"a100": 312.0, "a10": 125.0, "rtx3090": 71.0, "l4": 121.0,
                       "l40s": 362.0, "rtx4090": 165.0, "h100": 990.0, "h200": 990.0}
DENSE_TENSOR_OVER_FP32 = 8.0
# cuBLAS as nmgen's benches time it (one call, L2-cold): a fixed cost and shares of the
# peaks. H200 bf16 (results/records_h200/, 60 shapes): M = 1 and 8 ran 7.8 us at 8 MB and
# 4.1-4.3 TB/s at 0.3-0.4 GB; M = 2048 ran 740-800 TFLOP/s (655 at 2048^3).
DENSE_FIXED_US = 5.5
DENSE_COMPUTE_SHARE = 0.79
DENSE_BANDWIDTH_SHARE = 0.92


def dense_gemm_ms(spec: GpuSpec, shape: tuple[int, int, int], itemsize: int) -> float:
    """A roofline estimate of the dense GEMM (cuBLAS) of ``shape`` (M, N, K) with
    ``itemsize``-byte operands on ``spec``: 2-byte ones on the tensor cores, 4-byte ones on
    the FP32 units."""
    m, n, k = shape
    peak = (DENSE_TENSOR_TFLOPS.get(spec.name, DENSE_TENSOR_OVER_FP32 * spec.peak_fp32_tflops)
            if itemsize == 2 else spec.peak_fp32_tflops)
    compute_ms = 2 * m * n * k / (DENSE_COMPUTE_SHARE * peak * 1e9)
    memory_ms = itemsize * (m * k + k * n + m * n) / (DENSE_BANDWIDTH_SHARE * spec.dram_gbs * 1e6)
    return DENSE_FIXED_US / 1e3 + max(compute_ms, memory_ms)


# Substrings of CUDA device names, most specific first.
_DEVICE_NAMES = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("L40S", "l40s"),
                 ("RTX 4090", "rtx4090"), ("RTX 3090", "rtx3090"), ("A10", "a10"),
                 ("L4", "l4"))


def gpu_spec(name: str) -> GpuSpec:
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(sorted(GPUS))}") from None


def spec_or_h100(name: str) -> GpuSpec:
    """The table entry ``name``, or for a GPU the table lacks the H100's figures under
    its name (what the model assumes of an unknown GPU)."""
    return GPUS[name] if name in GPUS else replace(GPUS["h100"], name=name)


def gpu_of_device_name(device_name: str) -> str | None:
    """The table entry of a CUDA device name ('NVIDIA H100 80GB HBM3' → 'h100')."""
    for needle, name in _DEVICE_NAMES:
        if needle in device_name:
            return name
    return None


def table_name(device_name: str) -> str:
    """The name a device's tuned records are keyed on: its table entry, else its own name
    in lower case."""
    return gpu_of_device_name(device_name) or device_name.lower().replace(" ", "_")


def check_device(spec: GpuSpec, device_name: str, sms: int, major: int, minor: int) -> None:
    """Raise if the present device does not match the table entry it is tuned as."""
    found = gpu_of_device_name(device_name)
    if found != spec.name:
        raise ValueError(f"--gpu {spec.name}, but the device present is {device_name!r}"
                         + (f" ({found})" if found else ""))
    if sms != spec.sms or (major * 10 + minor) != spec.arch.number:
        raise ValueError(f"{device_name}: {sms} SMs, sm_{major}{minor}; the table says "
                         f"{spec.sms} SMs, {spec.arch.value}")


def arch_of_capability(major: int, minor: int) -> Arch:
    """The nearest supported compile target at or below a compute capability."""
    number = major * 10 + minor
    supported = sorted((a for a in Arch if a.number <= number), key=lambda a: a.number)
    if not supported:
        raise ValueError(f"compute capability {major}.{minor}: nmgen needs sm_80 or newer")
    return supported[-1]
