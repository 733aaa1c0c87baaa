"""A tuning task: one family's search over one problem on one GPU."""

from __future__ import annotations

from dataclasses import dataclass

from ..families.base import Family
from ..families.space import SearchSpace
from ..format import DType
from ..gpus import GpuSpec
from ..problem import ALayout, Problem
from ..shapes import Shape
from ..store.records import DeviceKey, ProblemKey


@dataclass(frozen=True)
class TuneTask:
    """``family``'s search (over ``space``, by default its whole space) for the problem
    ``problem`` of shape ``rows``×``depth``·``depth``×``cols`` on ``gpu``."""

    gpu: GpuSpec
    family: Family
    problem: Problem
    rows: int
    cols: int
    depth: int
    space: SearchSpace | None = None

    def __post_init__(self) -> None:
        if self.space is None:
            object.__setattr__(self, "space", self.family.space)
        if self.problem.arch is not self.gpu.arch:
            raise ValueError(f"{self.problem} is not for {self.gpu.name} ({self.gpu.arch.value})")

    @classmethod
    def of(cls, gpu: GpuSpec, family: Family, n: int, m: int, vec: int, a_layout: ALayout,
           shape: Shape, dtype: DType = DType.F32, space: SearchSpace | None = None
           ) -> TuneTask:
        return cls(gpu, family, Problem(n, m, vec, a_layout, gpu.arch, dtype), *shape,
                   space=space)

    @property
    def shape(self) -> Shape:
        return (self.rows, self.cols, self.depth)

    @property
    def study_name(self) -> str:
        p = self.problem
        return (f"nmgen_{self.gpu.name}_{self.family.name}_{p.dtype.value}_{p.n}:{p.m}"
                f"_l{p.vec}_{p.a_layout.value}_{self.rows}x{self.cols}x{self.depth}")

    def key(self, device_name: str, cuda_version: int) -> ProblemKey:
        """The key of the task's records as measured on ``device_name`` under the CUDA
        runtime ``cuda_version``."""
        device = DeviceKey(self.gpu.name, device_name, cuda_version, self.gpu.sms)
        return ProblemKey.of(self.problem, self.shape, device, self.family)
