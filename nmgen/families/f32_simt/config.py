"""``KernelConfig``: one instance of the FP32 SIMT template, validated, named and
serialisable (docs/design.md §2). Its rules are the family's resource rules."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from ...epilogue import NO_EPILOGUE, Epilogue
from ...format import MAX_M, DType
from ...gpus import REGISTERS_PER_SM, Arch
from ...problem import ALayout
from ..space import ConfigError, ConfigRecord


class ATile(str, Enum):
    """How the A tile sits in shared memory."""

    K_MAJOR = "tk"  # rows of K, MS floats wide: float4 fragment reads; row-major A lands
    #                 M-major first and each thread transposes the chunks it copied
    M_MAJOR = "tm"  # rows of M (row-major A only): 16-byte copies in, scalar fragment reads
    K_MAJOR_STAGED = "tr"  # K-major tile that row-major A reaches through registers:
    #                        16-byte loads issued before a stage's compute, stored
    #                        transposed after it (no landing tile; unpacked only)
    K_MAJOR_COPY = "tx"  # row-major A copied K-major by a transpose kernel first (two
    #                      launches and a K x M workspace); the main kernel is K-major's


FAMILY = "f32"
MAX_THREADS = 1024
MAX_REGISTERS = 255
MAX_STAGES = 3
MAX_SLICES = 8
STREAM_K_REGISTER_MARGIN = 24


# Parameters that came after the first tuned kernels, with the default that reproduces them.
LATER_PARAMETERS: dict[str, Any] = {"slice_k": 1, "stream_k": False, "tma": False}
# The bulk copy engine's limits (PTX cp.async.bulk.tensor): box sides, and the shared-memory
# alignment of a tensor copy's destination.
TMA_MAX_BOX = 256
TMA_ALIGN_WORDS = 32  # 128 bytes


@dataclass(frozen=True)
class KernelConfig(ConfigRecord):
    n: int
    m: int
    vec: int  # L
    ms: int
    ns: int
    ks: int
    mt: int
    nt: int
    warp_m: int = 8  # lanes of a warp along M ...
    warp_n: int = 4  # ... and along N (warp_m · warp_n = 32)
    packing: bool = False
    stages: int = 2
    split_k: int = 1
    slice_k: int = 1  # warp groups of a block that split each stage's rows (sliced K)
    stream_k: bool = False  # a persistent grid shares the last waves' stages out evenly
    tma: bool = False  # a stage's tiles copied by the bulk copy engine (sm_90), not cp.async
    a_layout: ALayout = ALayout.ROW_MAJOR
    a_tile: ATile = ATile.K_MAJOR
    arch: Arch = Arch.SM90
    # Bias and activation on the output (not tuned): in the main kernel's stores, or with
    # split-K in the reduction's, once the slices are summed.
    epilogue: Epilogue = NO_EPILOGUE
    family: ClassVar[str] = FAMILY
    later_parameters: ClassVar[dict[str, Any]] = LATER_PARAMETERS
    enum_fields: ClassVar[dict[str, type[Enum]]] = {"a_layout": ALayout, "a_tile": ATile,
                                                     "arch": Arch}
    flag_fields: ClassVar[tuple[str, ...]] = ("packing", "stream_k", "tma")


    # ----------------------------------------------------------------- derived sizes
    @property
    def dtype(self) -> DType:
        return DType.F32

    @property
    def ws(self) -> int:
        """Compressed rows of ``B'`` per main-loop stage."""
        return self.ks * self.n // self.m

    @property
    def slice_threads(self) -> int:
        """Threads that cover the MS x NS tile once: one slice of the block."""
        return (self.ms // self.mt) * (self.ns // self.nt)

    @property
    def threads(self) -> int:
        """Threads of a block: ``slice_k`` slices, each computing ``ws / slice_k`` of every
        stage's compressed rows for the whole tile; their sums meet in shared memory."""
        return self.slice_threads * self.slice_k

    @property
    def reduce_words(self) -> int:
        """Floats of the shared tile where the slices add up their partial sums."""
        return self.ms * self.ns if self.slice_k > 1 else 0

    @property
    def warps_n(self) -> int:
        return self.ns // (self.nt * self.warp_n)

    @property
    def block_groups(self) -> int:
        """Column groups of ``L`` touched by one block."""
        return max(1, self.ns // self.vec)

    @property
    def thread_groups(self) -> int:
        """Column groups of ``L`` covered by one thread's ``NT`` columns."""
        return max(1, self.nt // self.vec)

    @property
    def a_rows(self) -> int:
        """Rows of ``A`` (dense-K positions) held in shared memory per stage."""
        if self.packing:
            return min(self.ks, self.ws * self.block_groups)
        return self.ks

    @property
    def a_stride(self) -> int:
        """Shared-memory row stride of the A tile, in floats.

        K-major tile fed by a landing tile: swizzled (no pad) or, where the swizzle does not
        apply, padded by 4 floats so that K rows 4 apart sit 16 banks apart.
        M-major tile: rows of 16-byte chunks, the stride 4·odd so that the 8 rows a warp
        reads at once fall in 8 different banks.
        """
        if self.a_tile is ATile.M_MAJOR:
            stride = -(-self.a_rows // 4) * 4
            return stride + 4 if stride % 8 == 0 else stride
        if self.transposed and not self.swizzle:
            return self.ms + 4
        return self.ms

    @property
    def swizzle(self) -> bool:
        """Transposing stores go to an XOR-swizzled tile: float4 chunk j of K row k is
        stored at chunk j ^ (k/4 mod 8). A warp's transposing stores (4 M rows x 8 chunks
        along K) and its fragment reads then use all 32 banks. Needs whole 32-float
        windows: 32 | MS, 32 | A_ROWS, and a thread's row chunks 32 floats apart."""
        return (self.transposed and self.ms % 32 == 0 and self.a_rows % 32 == 0
                and (self.mt == 4 or self.warp_m * 4 % 32 == 0))

    @property
    def a_words(self) -> int:
        rows = self.ms if self.a_tile is ATile.M_MAJOR else self.a_rows
        return rows * self.a_stride

    @property
    def landing(self) -> bool:
        """Row-major A into a K-major tile: 16-byte copies land M-major, then each thread
        transposes its own chunks into one of two compute tiles."""
        return self.a_layout is ALayout.ROW_MAJOR and self.a_tile is ATile.K_MAJOR

    @property
    def staged(self) -> bool:
        """Row-major A through registers into a K-major tile (``tr``)."""
        return self.a_layout is ALayout.ROW_MAJOR and self.a_tile is ATile.K_MAJOR_STAGED

    @property
    def a_copied(self) -> bool:
        """Row-major A copied K-major by a transpose kernel before the main kernel, which
        then reads it as K-major A (``tx``)."""
        return self.a_layout is ALayout.ROW_MAJOR and self.a_tile is ATile.K_MAJOR_COPY

    @property
    def waits_for_copy(self) -> bool:
        """The main kernel is a programmatic dependent launch of A's copy (sm_90 and later):
        it starts as the copy's blocks finish and waits for the copy's writes at its top
        (``griddepcontrol.wait``); 1.0-1.6 us a call (docs/engineering-notes.md §6)."""
        return self.a_copied and self.arch.number >= 90

    @property
    def kernel_a_layout(self) -> ALayout:
        """The layout the main kernel reads A in."""
        return ALayout.K_MAJOR if self.a_copied else self.a_layout

    @property
    def transposed(self) -> bool:
        """Row-major A reaches a K-major compute tile by the threads' own transposing
        stores (through a landing tile or through registers)."""
        return self.landing or self.staged

    @property
    def a_slots(self) -> int:
        """16-byte A chunks a thread carries per stage (the template's A_SLOTS): the
        swizzled mapping's 8 chunks a row, else the paired mapping's cells."""
        chunks = -(-self.a_rows // 4)
        if self.swizzle:
            return chunks // 8 * -(-self.ms // max(1, self.threads // 8))
        cells = -(-chunks // 2) * 2 * self.ms  # chunk pairs x 2 lanes a row
        return -(-cells // self.threads)

    @property
    def a_phases(self) -> int:
        """A staged stage's A moves in this many phases spread over the compute of the
        stage before (a divisor of WS, about two chunks a phase): one phase's chunks are
        in registers at a time, and each has WS/A_PHASES rows of FFMAs to arrive."""
        most = max(1, self.a_slots // 2)
        return max(d for d in range(1, min(self.ws, most) + 1) if self.ws % d == 0)

    @property
    def phase_slots(self) -> int:
        return -(-self.a_slots // self.a_phases)

    @property
    def landing_stride(self) -> int:
        """Floats between rows of the M-major landing tile: the A-tile rows rounded to 4;
        without the swizzle (lanes in pairs along K), then to 8 mod 16, so that the 16-byte
        chunks of 4 rows x 2 lanes cover all banks."""
        rows4 = -(-self.a_rows // 4) * 4
        return rows4 if self.swizzle else rows4 + (8 - rows4) % 16

    @property
    def compute_tiles(self) -> int:
        """K-major tiles the threads transpose into (double-buffered; one for one stage)."""
        return (1 if self.stages == 1 else 2) if self.transposed else 0

    @property
    def landing_tiles(self) -> int:
        """Landing tiles: a stage's is transposed before the copies of the stage after the
        next are issued, so STAGES-1 of them (one for a single stage)."""
        return max(1, self.stages - 1) if self.landing else 0

    @functools.cached_property  # asked for by several rules and by the model
    def registers_estimate(self) -> int:
        """Registers per thread: accumulators, an A fragment per column group and a B
        fragment, addressing and loop state (the model's estimate; the nvcc tests keep it
        in step with ptxas: no spills under the launch bounds it implies)."""
        fragments = self.mt * self.thread_groups + self.nt
        # Packing reads its row table while loading; a single stage keeps more live.
        packing_table = 32 if self.packing else 0
        single_stage = 8 if self.stages == 1 else 0
        split = 8 if self.split_k > 1 else 0
        # Sliced K (the slice's rows, the reduction's addressing): ptxas finds these in the
        # slack of 64 or more accumulators (8x8 tiles sliced 4 ways: 128, no spill), not
        # below (a 4x4 tile spilled at 80).
        split += 8 if self.slice_k > 1 and self.mt * self.nt < 64 else 0
        staged = 4 * self.phase_slots + 8 if self.staged else 0  # A chunks in flight
        split += 8 if self.stream_k else 0  # the persistent loop's state
        extra = packing_table + single_stage + split + self._landing_registers + staged
        return max(self.mt * self.nt + fragments + 48 + extra, 80)

    @property
    def _landing_registers(self) -> int:
        """What the unpacked landing path keeps live beyond the rest: ptxas hoists the
        transposition's 16-byte reads of a stage ahead of their stores, and past 4 chunks a
        thread (up to 16) they no longer fit the slack of the estimate. Fitted to ptxas on
        320 sampled landing kernels and the core grid's: every kernel that spilled more
        than the small known spill at an exact budget now gets the registers or is refused;
        packed landing kernels never spilled and are not charged."""
        if not self.landing or self.packing:
            return 0
        chunks = self.ms * self.a_rows // 4 // self.threads
        return 4 * max(0, min(chunks, 16) - 4)

    @property
    def pos_words(self) -> int:
        """32-bit words of the per-stage index table (A-tile row of every kept row), 16-B
        padded; with TMA padded further, so that every stage buffer starts 128-B aligned."""
        return self._table_words(self.table_bytes)

    def _table_words(self, entry_bytes: int) -> int:
        words = -(-self.block_groups * self.ws * entry_bytes // 16) * 4
        if self.tma:
            tiles = self.a_words + self.ws * self.ns + words
            words += -tiles % TMA_ALIGN_WORDS
        return words

    @functools.cached_property
    def table_bytes(self) -> int:
        """Bytes of an index-table entry: int32, except for a TMA kernel whose int32 tables
        would leave no room for its mbarriers; such a kernel keeps uint16 entries (a row
        of the A tile, < KS <= 256). 12:32 at 128x256, KS 128, 2 stages is one: its int32
        tiles and tables fill the 227 KB exactly. Every other kernel keeps int32."""
        if not self.tma:
            return 4
        wide = 4 * self.stages * (self.a_words + self.ws * self.ns + self._table_words(4))
        return 2 if wide + self.barrier_bytes > self.arch.max_smem_per_block else 4

    @property
    def stage_words(self) -> tuple[int, int, int]:
        """Floats/ints per pipeline stage: (A tile, B' tile, index table); the A tile is 0
        where A goes through the compute tiles instead."""
        return (0 if self.transposed else self.a_words), self.ws * self.ns, self.pos_words

    @property
    def landing_words(self) -> int:
        return self.ms * self.landing_stride

    @functools.cached_property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per block: the pipeline's buffers, which the slices'
        reduction reuses once the main loop is done (and stream-K's state)."""
        pipeline = (self.stages * sum(self.stage_words) + self.landing_tiles * self.landing_words
                    + self.compute_tiles * self.a_words)
        return 4 * max(pipeline, self.reduce_words) + self.stream_state_bytes + self.barrier_bytes

    @property
    def stream_state_bytes(self) -> int:
        """Shared memory past the pipeline where a stream-K block keeps its walk's state."""
        return 16 if self.stream_k else 0

    @property
    def barrier_bytes(self) -> int:
        """Shared memory past the pipeline for the TMA path's mbarriers (one a stage)."""
        return -(-8 * self.stages // 16) * 16 if self.tma else 0

    def _rules(self) -> Iterator[tuple[str, bool]]:
        """(rule, holds) pairs, cheap ones first; lazily, so that a configuration is
        refused at its first broken rule without working out the costly rest (the
        tuner's space tries ~60,000 a pattern)."""
        if not all(v >= 1 for v in (self.n, self.m, self.vec, self.ms, self.ns, self.ks,
                                    self.mt, self.nt, self.warp_m, self.warp_n, self.stages,
                                    self.split_k, self.slice_k)):
            yield "all sizes >= 1", False
            return
        yield ("1 <= n <= m", self.n <= self.m)
        yield (f"m <= {MAX_M}", self.m <= MAX_M)
        yield ("KS % m == 0", self.ks % self.m == 0)
        yield ("KS >= 4 (16-byte chunks of A)", self.ks >= 4)
        yield ("NS % L == 0 or L % NS == 0", self.ns % self.vec == 0 or self.vec % self.ns == 0)
        yield ("NT % L == 0 or L % NT == 0", self.nt % self.vec == 0 or self.vec % self.nt == 0)
        yield ("MT % 4 == 0 and NT % 4 == 0 (float4 fragments)", self.mt % 4 == 0
               and self.nt % 4 == 0)
        yield ("warp_m * warp_n == 32", self.warp_m * self.warp_n == 32)
        yield ("MS % (MT * warp_m) == 0", self.ms % (self.mt * self.warp_m) == 0)
        yield ("NS % (NT * warp_n) == 0", self.ns % (self.nt * self.warp_n) == 0)
        yield (f"threads = slice_k*(MS/MT)*(NS/NT) <= {MAX_THREADS}",
               self.threads <= MAX_THREADS)
        yield ("MT * NT <= 128 accumulators", self.mt * self.nt <= 128)
        yield (f"1 <= stages <= {MAX_STAGES}", self.stages <= MAX_STAGES)
        yield ("KS <= 1024", self.ks <= 1024)
        yield (f"slice_k <= {MAX_SLICES} and WS % slice_k == 0 (whole rows a slice)",
               self.slice_k <= MAX_SLICES and self.ws % self.slice_k == 0)
        yield ("M-major, staged and copied A tiles (tm, tr, tx) need row-major A (rm)",
               self.a_tile is ATile.K_MAJOR or self.a_layout is ALayout.ROW_MAJOR)
        yield ("staged A tile (tr) without packing", not (self.staged and self.packing))
        yield ("staged A tile (tr) needs the swizzled tile (32 | MS, 32 | A rows, MT 4 or "
               "warp_m >= 8) and at most 16 chunks a thread",
               not self.staged or (self.swizzle and self.a_slots <= 16))
        yield ("sliced K (slice_k > 1) not with the staged A tile (tr)",
               self.slice_k == 1 or not self.staged)
        yield ("stream-K (stream_k) not with split-K or sliced K (split_k = slice_k = 1)",
               not self.stream_k or (self.split_k == 1 and self.slice_k == 1))
        # Row-major A tiles built in the kernel (tm, tr, landing tk) already need more
        # registers; with the persistent loop some spilled (36 bytes to a kilobyte). The
        # 101 stream-K winners of the tuned database are all K-major or copied A.
        yield ("stream-K (stream_k) only where the kernel reads K-major A (km, or rm_tx)",
               not self.stream_k or self.kernel_a_layout is ALayout.K_MAJOR)
        yield from self._tma_rules()
        yield (f"registers (~{self.registers_estimate}) <= {MAX_REGISTERS}",
               self.registers_estimate <= MAX_REGISTERS)
        # The persistent loop needs registers beyond the estimate's 8 where the tile fills
        # the register file, more with more column groups a thread (16x8 and 8x16 tiles of
        # two groups spilled 24-32 bytes at 255): stream-K keeps this margin below the cap.
        margin = STREAM_K_REGISTER_MARGIN * self.thread_groups
        yield (f"stream-K registers (~{self.registers_estimate} + {margin}) <= {MAX_REGISTERS}",
               not self.stream_k or self.registers_estimate + margin <= MAX_REGISTERS)
        yield (f"threads * registers ({self.threads} * ~{self.registers_estimate}) <= "
               f"{REGISTERS_PER_SM} per SM", self.threads * self.registers_estimate
               <= REGISTERS_PER_SM)
        yield (f"shared memory {self.smem_bytes} B <= {self.arch.max_smem_per_block} B "
               f"({self.arch.value} limit per block)",
               self.smem_bytes <= self.arch.max_smem_per_block)

    def _tma_rules(self) -> Iterator[tuple[str, bool]]:
        """What the bulk copy engine path covers: whole K-major, unpacked A tiles and B'
        tiles as tensor copies, the table as one bulk copy, all within the engine's box
        and alignment limits; a data-parallel, unsliced pipeline of two or more stages."""
        if not self.tma:
            return
        yield ("TMA copies (tma) need sm_90", self.arch is Arch.SM90)
        yield ("TMA copies (tma) only where the kernel reads K-major A (km, or rm_tx)",
               self.kernel_a_layout is ALayout.K_MAJOR)
        yield ("TMA copies (tma) without packing", not self.packing)
        yield ("TMA copies (tma) need 2 or more stages", self.stages >= 2)
        yield ("TMA copies (tma) not with stream-K or sliced K (stream_k off, slice_k = 1)",
               not self.stream_k and self.slice_k == 1)
        yield (f"TMA copies (tma): MS, KS, NS and WS <= {TMA_MAX_BOX} (box sides)",
               max(self.ms, self.ks, self.ns, self.ws) <= TMA_MAX_BOX)
        yield ("TMA copies (tma): MS * KS % 32 == 0 (the B' tile 128-byte aligned)",
               self.a_words % TMA_ALIGN_WORDS == 0)
        yield (f"TMA copies (tma): table of whole 16-byte chunks a stage "
               f"(NS/L groups * WS * {self.table_bytes} B % 16 == 0)",
               self.block_groups * self.ws * self.table_bytes % 16 == 0)

    # ----------------------------------------------------------------- naming
    @functools.cached_property  # the search sorts thousands by name, again for every shape
    def name(self) -> str:
        """Canonical name stating every parameter, CUTLASS style.

        e.g. ``nm_spmm_f32_n8m32l32_ms128ns128ks32_mt8nt8_w8x4_pack_s2_k1_rm_sm90``; a
        sliced-K kernel adds ``_sk{slice_k}`` after the split (``..._s2_k1_sk4_km_sm90``), a
        stream-K kernel ``_streamk`` (``..._s2_k1_streamk_km_sm90``), a kernel whose copies
        go by the bulk copy engine ``_tma`` after the A layout and tile
        (``..._s3_k1_km_tma_sm90``); an epilogue's tag last (``..._km_sm90_bias_silu``).
        """
        pack = "pack" if self.packing else "nopack"
        return (
            f"nm_spmm_{self.family}_n{self.n}m{self.m}l{self.vec}"
            f"_ms{self.ms}ns{self.ns}ks{self.ks}_mt{self.mt}nt{self.nt}"
            f"_w{self.warp_m}x{self.warp_n}_{pack}_s{self.stages}_k{self.split_k}"
            f"{self._slice_suffix}{'_streamk' if self.stream_k else ''}"
            f"_{self.a_layout.value}{self._tile_suffix}{'_tma' if self.tma else ''}"
            f"_{self.arch.value.replace('_', '')}{self.epilogue.suffix}"
        )

    @property
    def _slice_suffix(self) -> str:
        return "" if self.slice_k == 1 else f"_sk{self.slice_k}"

    @property
    def _tile_suffix(self) -> str:
        return "" if self.a_tile is ATile.K_MAJOR else f"_{self.a_tile.value}"

    @classmethod
    def from_name(cls, name: str) -> KernelConfig:
        base, epilogue = Epilogue.split_name(name)
        match = _NAME_RE.match(base)
        if not match:
            raise ConfigError(f"{name!r} is not a kernel name (e.g. {_EXAMPLE_NAME})")
        g = match.groupdict()
        if g["family"] != FAMILY:
            raise ConfigError(f"{name!r} is not a kernel of the {FAMILY} family")
        ints = {k: int(v) for k, v in g.items()
                if k not in ("family", "pack", "streamk", "layout", "tile", "tma", "arch")
                and v is not None}
        return cls(
            **ints,
            packing=g["pack"] == "pack",
            stream_k=g["streamk"] is not None,
            tma=g["tma"] is not None,
            a_layout=ALayout(g["layout"]),
            a_tile=ATile(g["tile"] or ATile.K_MAJOR.value),
            arch=Arch(f"sm_{g['arch']}"),
            epilogue=epilogue,
        )


    def cp_async_twin(self) -> KernelConfig:
        """The same tiles with cp.async copies: what a ``tma`` kernel runs on an A that
        the bulk copy engine cannot address. Its index tables are 32-bit (the TMA path's
        may be 16-bit), so where that passes the shared-memory limit the twin keeps fewer
        stages."""
        for stages in range(self.stages, 1, -1):
            try:
                return self.replace(tma=False, stages=stages)
            except ConfigError:
                continue
        return self.replace(tma=False, stages=1)


_NAME_RE = re.compile(
    r"^nm_spmm_(?P<family>[a-z0-9]+)_n(?P<n>\d+)m(?P<m>\d+)l(?P<vec>\d+)"
    r"_ms(?P<ms>\d+)ns(?P<ns>\d+)ks(?P<ks>\d+)_mt(?P<mt>\d+)nt(?P<nt>\d+)"
    r"_w(?P<warp_m>\d+)x(?P<warp_n>\d+)_(?P<pack>pack|nopack)_s(?P<stages>\d+)"
    r"_k(?P<split_k>\d+)(?:_sk(?P<slice_k>\d+))?(?P<streamk>_streamk)?_(?P<layout>rm|km)(?:_(?P<tile>tk|tm|tr|tx))?(?P<tma>_tma)?_sm(?P<arch>\d+)$"
)
_EXAMPLE_NAME = "nm_spmm_f32_n8m32l32_ms128ns128ks32_mt8nt8_w8x4_pack_s2_k1_rm_sm90"
