"""What the decode template reads beside the configuration (part of the family's
generator hash, with the template)."""

from __future__ import annotations

from typing import Any

from ...problem import ALayout
from .config import GemvConfig

TEMPLATE = "nm_gemv.cu.j2"


def template_arguments(config: GemvConfig) -> dict[str, Any]:
    return {"row_major": config.a_layout is ALayout.ROW_MAJOR}


def entry_points(config: GemvConfig) -> tuple[str, ...]:
    return (config.name,)
