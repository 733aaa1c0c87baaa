"""nmgen: a code-generating kernel compiler and autotuner for vector-wise N:M sparse GEMM.

The pipeline, bottom up: ``format`` (prune, ``NMMatrix``) → ``families`` (each family's
configuration, search space, model, weight preparation and launch plan) → ``codegen``
(Jinja2 → CUDA) → ``compiler`` (nvcc, NVRTC) → ``runtime`` (launches; the CuPy/torch
boundary) and ``store`` (the tuned database) → ``policy`` (winners) and ``calibration``
(models fitted to a GPU's records) → ``transfer`` (tuned kernels adapted to untuned
problems) → ``tune`` and ``dispatch`` → ``bench`` and ``cli``. GPU libraries are imported
only when a kernel runs.
"""

from .codegen import KernelSource, render
from .dispatch import dispatch, dispatch_stats
from .families.f32_simt.config import KernelConfig
from .families.registry import register
from .families.space import ConfigError
from .format import DType, NMMatrix, Pattern, prune, reference
from .gpus import Arch
from .problem import ALayout, Problem
from .runtime.launch import Kernel
from .version import __version__

__all__ = [
    "ALayout",
    "Arch",
    "ConfigError",
    "DType",
    "Kernel",
    "KernelConfig",
    "KernelSource",
    "NMMatrix",
    "Pattern",
    "Problem",
    "__version__",
    "dispatch",
    "dispatch_stats",
    "prune",
    "reference",
    "register",
    "render",
]
