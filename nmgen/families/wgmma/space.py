"""The wgmma family's search space, declared once (``SPACE``)."""

from __future__ import annotations

from typing import Any

from ..space import Param, SearchSpace
from ..tensor_core.space import TensorCoreMapping
from .config import BLOCK_NS, FAMILY, WgmmaConfig

SPACE_PARAMS = (
    Param("bm", (64, 128, 256)),  # block tile rows: 64 * tiles_m * warpgroups
    Param("bn", BLOCK_NS),  # block tile columns (a divisor of L)
    Param("windows", (1, 2, 4, 8, 16, 32)),  # windows a stage: bk = windows * n
    Param("warpgroups", (1, 2, 4)),  # 4: 256-row tiles of one m64 tile a warpgroup
    Param("stages", (3, 4, 5)),
    Param("producer", ("shared", "warp", "tma")),  # who copies the stages in (config.Producer)
)


class _Mapping(TensorCoreMapping):
    """The tensor-core parameters and the producer (by its value)."""

    config_type = WgmmaConfig

    @property
    def names(self) -> tuple[str, ...]:
        return (*super().names, "producer")

    def values_of(self, config: WgmmaConfig) -> dict[str, Any]:
        return {**super().values_of(config), "producer": config.producer.value}

    def quick_reject(self, values: dict[str, Any]) -> bool:
        tiles_m, rest = divmod(values["bm"], 64 * values["warpgroups"])
        return rest != 0 or not 1 <= tiles_m <= 2


SPACE = SearchSpace(FAMILY, SPACE_PARAMS, _Mapping())
