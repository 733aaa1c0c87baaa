"""``TensorCoreFamily``: what the tensor-core families answer alike, beyond the
``ModularFamily`` convention: this package's weight layout and launch plan (the modules
their own packages lack), the transpose of row-major A and its template."""

from __future__ import annotations

from typing import ClassVar

from ...gpus import Arch
from ...problem import Problem
from ..base import EPILOGUE_TEMPLATE, TRANSPOSE_TEMPLATE, ModularFamily, PreparedWeight
from ..plan import Call, Device, LaunchPlan
from . import launch, transpose
from .config import DTYPES, TensorCoreConfig

MAX_SERVED_M = 64  # the largest window size m the families serve


class TensorCoreFamily(ModularFamily):
    """A family of one template and one configuration class (``config_type``), whose
    weight layout and launch plan are this package's; it serves BF16 and FP16 problems
    of the vector lengths ``served_vecs`` on the targets ``archs``."""

    dtypes = DTYPES
    served_vecs: ClassVar[frozenset[int]]
    archs: ClassVar[frozenset[Arch]]
    archs_named: ClassVar[str]  # the targets, for people: "sm_80 or newer"
    base_package = __package__
    shared_templates = (EPILOGUE_TEMPLATE, TRANSPOSE_TEMPLATE)
    # A tile wider than L spans several index sets, each gathering its own A rows: the
    # model misjudges such tiles differently at each L (results/untuned_h100/bf16_vec_terms/)
    calibrate_by_vec = True

    def serves(self, problem: Problem) -> str | None:
        refused = super().serves(problem)
        if refused is not None:
            return refused
        if problem.arch not in self.archs:
            return f"{self.name} kernels need {self.archs_named}"
        if problem.vec not in self.served_vecs:
            return f"{self.name} kernels take L in {sorted(self.served_vecs)}"
        if problem.m > MAX_SERVED_M:
            return f"{self.name} kernels take m <= {MAX_SERVED_M}"
        return None

    def plan(self, config: TensorCoreConfig, weight: PreparedWeight, shape: tuple[int, int],
             call: Call, device: Device) -> LaunchPlan:
        """The kernel's launch; after the transpose of row-major A where it reads a
        K-major copy (``a_copied``)."""
        if config.a_copied:
            return transpose.plan(config, weight, shape, call, device)
        return launch.plan(config, weight, shape, call, device)
