"""A second kernel family, defined outside the package: one thread an output element,
no tiling. It exists to show that a family plugs in through ``nmgen.families`` alone:
the tests register it, tune it, store its results and dispatch to it, with no change to
the tuner, the store or the dispatcher."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from nmgen.families.base import Family, PreparedWeight
from nmgen.families.plan import A, C, Call, Device, Launch, LaunchPlan, Pointer, Scalar
from nmgen.families.space import ConfigError, Param, SearchSpace
from nmgen.format import DType, NMMatrix
from nmgen.gpus import Arch, GpuSpec
from nmgen.problem import ALayout, Problem

HERE = Path(__file__).resolve().parent
NAME = "naive"


@dataclass(frozen=True)
class NaiveConfig:
    n: int
    m: int
    vec: int
    threads: int
    unroll: int
    a_layout: ALayout = ALayout.ROW_MAJOR
    arch: Arch = Arch.SM90
    family: ClassVar[str] = NAME

    def __post_init__(self) -> None:
        object.__setattr__(self, "a_layout", ALayout(self.a_layout))
        object.__setattr__(self, "arch", Arch(self.arch))
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ConfigError(f"threads {self.threads}: a multiple of 32 up to 1024")
        if self.n % self.unroll:
            raise ConfigError(f"unroll {self.unroll} must divide n = {self.n}")

    @property
    def dtype(self) -> DType:
        return DType.F32

    @property
    def name(self) -> str:
        return (f"nm_naive_n{self.n}m{self.m}l{self.vec}_t{self.threads}_u{self.unroll}"
                f"_{self.a_layout.value}_{self.arch.value.replace('_', '')}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(a_layout=self.a_layout.value, arch=self.arch.value, family=NAME)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


class _Mapping:
    def allowed(self, problem: Problem, param: str, choices: tuple) -> tuple:
        return choices

    def build(self, problem: Problem, values: dict[str, Any]) -> NaiveConfig:
        return NaiveConfig(problem.n, problem.m, problem.vec, values["threads"],
                           values["unroll"], problem.a_layout, problem.arch)

    def values_of(self, config: NaiveConfig) -> dict[str, Any]:
        return {"threads": config.threads, "unroll": config.unroll}

    def quick_reject(self, values: dict[str, Any]) -> bool:
        return False


class _Ranker:
    def __init__(self, family: NaiveFamily, configs: Sequence[NaiveConfig], gpu: GpuSpec):
        self.family, self.configs, self.gpu = family, list(configs), gpu

    def rank(self, rows: int, cols: int, depth: int) -> list[tuple[float, NaiveConfig]]:
        timed = [(self.family.estimate_ms(c, self.gpu, (rows, cols, depth)), c)
                 for c in self.configs]
        return sorted(timed, key=lambda tc: (tc[0], tc[1].name))


class NaiveFamily(Family):
    name = NAME
    title = "naive reference (one thread an output)"
    dtypes = frozenset({DType.F32})
    space = SearchSpace(NAME, (Param("threads", (64, 128, 256)), Param("unroll", (1, 2))),
                        _Mapping())

    def config_from_dict(self, values: dict[str, Any]) -> NaiveConfig:
        values = {k: v for k, v in values.items() if k != "family"}
        return NaiveConfig(**values)

    def config_from_name(self, name: str) -> NaiveConfig | None:
        return None

    def feasible(self, config: NaiveConfig, gpu: GpuSpec) -> str | None:
        return None

    def estimate_ms(self, config: NaiveConfig, gpu: GpuSpec, shape: tuple[int, int, int]
                    ) -> float:
        rows, cols, depth = shape
        flops = 2.0 * rows * cols * depth * config.n / config.m
        return flops / (gpu.peak_fp32_tflops * 1e9 * 0.05) * (1 + 64 / config.threads)

    def ranker(self, configs: Sequence[NaiveConfig], gpu: GpuSpec) -> _Ranker:
        return _Ranker(self, configs, gpu)

    @property
    def templates(self) -> Path:
        return HERE / "templates"

    def template_name(self, config: NaiveConfig) -> str:
        return "nm_naive.cu.j2"

    def template_arguments(self, config: NaiveConfig) -> dict[str, Any]:
        return {"row_major": config.a_layout is ALayout.ROW_MAJOR}

    def entry_points(self, config: NaiveConfig) -> tuple[str, ...]:
        return (config.name,)

    def generator_files(self) -> tuple[Path, ...]:
        return (self.templates / "nm_naive.cu.j2", Path(__file__))

    def prepare(self, weight: NMMatrix, config: NaiveConfig) -> PreparedWeight:
        return PreparedWeight(None, {"values": weight._values,
                                     "indices": weight._indices.astype("int32")})

    def layout_key(self, config: NaiveConfig) -> Any:
        return None

    def plan(self, config: NaiveConfig, weight: PreparedWeight, shape: tuple[int, int],
             call: Call, device: Device) -> LaunchPlan:
        depth, cols = shape
        values = weight.arrays["values"]
        blocks = -(-call.rows * cols // config.threads)
        args = (Pointer(A), Pointer("values"), Pointer("indices"), Pointer(C),
                Scalar("i32", call.rows), Scalar("i32", cols), Scalar("i32", depth),
                Scalar("i64", call.lda), Scalar("i32", values.shape[0]),
                Scalar("i32", values.shape[1]), Scalar("i32", weight.arrays["indices"].shape[1]))
        return LaunchPlan((Launch(config.name, (blocks, 1, 1), config.threads, 0, args),))


NAIVE = NaiveFamily()
