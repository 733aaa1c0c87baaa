"""Code generation: one Jinja2 template per kernel family renders one configuration."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2

from .config import ALayout, ATile, Family, KernelConfig
from .model import min_blocks_per_sm
from .version import __version__

TEMPLATE_OF_FAMILY = {Family.F32_SIMT: "nm_spmm_f32.cu.j2"}
# The compute loop over a stage's compressed rows is unrolled by at most ROW_UNROLL: on an
# H100 the K-major core kernels are fastest so (results/ab_fixed_h100/runs/unroll: full
# unroll 1-3 % slower at 32 and 48 rows, by 8 or 4 slower still), and nvcc takes less time
# than unrolled fully (results/unroll_h100/nvcc_seconds.txt).
ROW_UNROLL = 16
COPY_UNROLL = 8  # the stage-copy loops' unroll where it divides their trip counts
# The transpose kernel of a copied A tile ("tx") moves COPY_A_TILE x COPY_A_TILE floats a
# block of COPY_A_THREADS threads; the template and the launcher both take them from here.
COPY_A_TILE = 64
COPY_A_THREADS = 256


@dataclass(frozen=True)
class KernelSource:
    config: KernelConfig
    code: str

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def entry_points(self) -> tuple[str, ...]:
        extra = (["_reduce"] if self.config.split_k > 1 else []) + (
            ["_transpose"] if self.config.a_copied else [])
        return (self.name, *(self.name + suffix for suffix in extra))

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(_load_template),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _load_template(name: str) -> str:
    return (templates_dir() / name).read_text()


def templates_dir() -> Path:
    """Installed templates (``nmgen.templates``), else the source tree's ``templates/``."""
    try:
        return Path(str(resources.files("nmgen.templates")))
    except ModuleNotFoundError:  # running from a checkout that is not installed
        return Path(__file__).resolve().parent.parent / "templates"


def template_text(family: Family) -> str:
    return _load_template(TEMPLATE_OF_FAMILY[family])


def generator_text(family: Family) -> str:
    """What turns a configuration into source beside the configuration itself: its
    family's template and this module (unrolls, template arguments). Tuned records are
    keyed on its hash, so that changing either orphans timings of code no longer built."""
    return template_text(family) + Path(__file__).read_text()


def row_unroll(config: KernelConfig) -> int:
    """How far the compute loop over a stage's ``ws`` compressed rows is unrolled."""
    return min(config.ws // config.slice_k, ROW_UNROLL)


def copy_trip_counts(config: KernelConfig) -> list[int]:
    """Rows a thread steps through in the stage copies that keep one chunk column a
    thread (``for_each_cell`` / ``for_each_chunk_at``): B' and the A tile."""
    tiles = [(config.ws, config.ns // 4)]  # B': WS rows of NS/4 chunks
    if config.a_tile is ATile.M_MAJOR:
        tiles.append((config.ms, config.ks // 4))
    elif config.landing and not config.swizzle:  # chunk pairs x 2 lanes a landing row
        tiles.append(((-(-config.a_rows // 4) + 1) // 2, 2 * config.ms))
    elif not config.staged:
        tiles.append((config.a_rows, config.ms // 4))
    return [-(-rows // (config.threads // chunks)) for rows, chunks in tiles
            if config.threads % chunks == 0]


def copy_unroll(config: KernelConfig) -> int:
    """The copy loops' unroll: COPY_UNROLL, or all of the longest copy loop where a trip
    count above COPY_UNROLL is not a multiple of it (12 steps unrolled by 8 left a
    remainder loop that cost the 12:32 core kernel 2.7 %: results/ab_fixed_h100)."""
    trips = copy_trip_counts(config)
    if any(n > COPY_UNROLL and n % COPY_UNROLL for n in trips):
        return max(trips)
    return COPY_UNROLL


def serpentine_ffma(config: KernelConfig) -> bool:
    """Whether odd thread-tile rows walk their columns backwards in the FFMA loop. It
    pays on 8x8 thread tiles (+1.2 to +3.6 % on all five 8x8 tuned winners timed) and
    costs 0.7-2.7 % on 16x8 ones (results/ab_fixed_h100/README.md)."""
    return config.mt == 8 and config.nt == 8


@functools.lru_cache(maxsize=1024)
def render(config: KernelConfig) -> KernelSource:
    """The CUDA source of ``config``, with a header naming it and the nmgen version."""
    return _render(_environment().get_template(TEMPLATE_OF_FAMILY[config.family]), config)


def render_text(config: KernelConfig, template: str) -> KernelSource:
    """``config`` rendered from the template text ``template`` instead of its family's
    template (A/B of two template versions in one process: tools/template_ab.py)."""
    return _render(_environment().from_string(template), config)


def _render(template: jinja2.Template, config: KernelConfig) -> KernelSource:
    code = template.render(
        c=config,
        name=config.name,
        version=__version__,
        config_items=sorted(config.to_dict().items()),
        row_major=config.kernel_a_layout is ALayout.ROW_MAJOR,
        m_major_tile=config.a_tile is ATile.M_MAJOR,
        unroll_w=row_unroll(config),
        copy_unroll=copy_unroll(config),
        serpentine=serpentine_ffma(config),
        min_blocks=min_blocks_per_sm(config),
        copy_tile=COPY_A_TILE,
        copy_threads=COPY_A_THREADS,
        pos_t="int" if config.table_bytes == 4 else "unsigned short",
    )
    return KernelSource(config, code)
