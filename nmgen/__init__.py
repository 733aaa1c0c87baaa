"""nmgen: a code-generating kernel compiler and autotuner for vector-wise N:M sparse GEMM.

Pipeline: ``format`` (prune, NMMatrix) → ``config`` (KernelConfig) → ``model`` →
``codegen`` (Jinja2 → CUDA) → ``compile`` (nvcc) / ``launch`` (NVRTC through CuPy).
Only ``launch`` touches CuPy, and only when a kernel is called.
"""

from .codegen import KernelSource, render
from .config import ALayout, Arch, ConfigError, Family, KernelConfig
from .dispatch import dispatch, dispatch_stats
from .format import NMMatrix, Pattern, prune, reference
from .gpu.launch import Kernel
from .version import __version__

__all__ = [
    "ALayout",
    "Arch",
    "ConfigError",
    "Family",
    "Kernel",
    "KernelConfig",
    "KernelSource",
    "NMMatrix",
    "Pattern",
    "__version__",
    "dispatch",
    "dispatch_stats",
    "prune",
    "reference",
    "render",
]
