"""``TensorCoreFamily``: the family methods that the tensor-core families answer alike,
from their configuration class, their folder (templates, ``render.py``) and this
package's weight layout and launch plan."""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any, ClassVar

from ...cache import cache_file, load_or_build
from ...format import NMMatrix
from ...problem import Problem
from ..base import EPILOGUE_TEMPLATE, TRANSPOSE_TEMPLATE, Family, PreparedWeight
from ..plan import Call, Device, LaunchPlan
from ..space import SearchSpace
from . import SOURCES, launch, prepare, transpose
from .config import TensorCoreConfig


class TensorCoreFamily(Family):
    """A family of one template (``template``, in its folder's ``templates``, with the
    arguments of its ``render.py``) and one configuration class (``config_type``)."""

    config_type: ClassVar[type[TensorCoreConfig]]
    template: ClassVar[str]
    # A tile wider than L spans several index sets, each gathering its own A rows: the
    # model misjudges such tiles differently at each L (results/untuned_h100/bf16_vec_terms/)
    calibrate_by_vec = True

    @property
    def folder(self) -> Path:
        """The family's package."""
        return Path(inspect.getfile(type(self))).resolve().parent

    def config_from_dict(self, values: dict[str, Any]) -> TensorCoreConfig:
        return self.config_type.from_dict(values)

    def config_from_name(self, name: str) -> TensorCoreConfig | None:
        if not name.startswith(f"nm_{self.name}_"):
            return None
        return self.config_type.from_name(name)

    def seed_candidates(self, problem: Problem, space: SearchSpace) -> list[TensorCoreConfig]:
        return list(enumeration(self, problem, space))

    @property
    def templates(self) -> Path:
        return self.folder / "templates"

    def template_name(self, config: TensorCoreConfig) -> str:
        return self.template

    def generator_files(self) -> tuple[Path, ...]:
        return (self.templates / self.template, EPILOGUE_TEMPLATE, TRANSPOSE_TEMPLATE,
                self.folder / "render.py")

    def source_files(self) -> tuple[Path, ...]:
        return super().source_files() + SOURCES

    def prepare(self, weight: NMMatrix, config: TensorCoreConfig) -> PreparedWeight:
        return prepare.prepare(weight, config)

    def layout_key(self, config: TensorCoreConfig) -> Any:
        return prepare.layout_key(config)

    def plan(self, config: TensorCoreConfig, weight: PreparedWeight, shape: tuple[int, int],
             call: Call, device: Device) -> LaunchPlan:
        """The kernel's launch; after the transpose of row-major A where it reads a
        K-major copy (``a_copied``)."""
        if config.a_copied:
            return transpose.plan(config, weight, shape, call, device)
        return launch.plan(config, weight, shape, call, device)


@functools.cache
def enumeration(family: TensorCoreFamily, problem: Problem, space: SearchSpace
                ) -> tuple[TensorCoreConfig, ...]:
    """Every valid configuration of ``space`` for ``problem`` (cached in the process and on
    disk)."""
    path = cache_file("space", (family.name, problem, space), family.source_files())
    return load_or_build(path, lambda: tuple(space.enumerate(problem)), tuple)
