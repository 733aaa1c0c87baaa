"""A launch described as plain data: what a family's kernels need for one call.

A family builds a ``LaunchPlan`` for (configuration, prepared weight, call) without
touching a GPU library; the runtime (``nmgen.runtime.launch``) turns it into driver
launches, filling in the addresses of the call's operands and workspaces. Arguments name
buffers: ``"a"`` and ``"c"`` (the call's operand and output), ``"bias"`` (the bias of a
kernel with an epilogue: 0 where it adds none), the prepared weight's arrays by their
names, and the plan's workspaces by theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

A, C, BIAS = "a", "c", "bias"


@dataclass(frozen=True)
class Scalar:
    """A value argument: ``kind`` is ``"i32"``, ``"i64"`` or ``"u64"``."""

    kind: str
    value: int


@dataclass(frozen=True)
class Pointer:
    """The device address of a buffer."""

    buffer: str


@dataclass(frozen=True)
class Aligned16:
    """An ``i32`` flag: ``allowed`` and the buffer's address a multiple of 16 bytes (a
    kernel's 16-byte stores to it)."""

    buffer: str
    allowed: bool


@dataclass(frozen=True)
class TensorMap2D:
    """A Hopper tensor map (by value) of a 2-D matrix in a buffer: ``cols`` × ``rows``
    elements of ``itemsize`` bytes, rows ``ld`` elements apart, copied in boxes of
    ``box`` = (cols, rows); out-of-bounds reads return zeros. ``swizzle_128b``: a box
    lands in shared memory in the 128-byte swizzle (each 16-byte chunk at its index XOR
    the address's bits 7-9; a box row at most 128 bytes)."""

    buffer: str
    cols: int
    rows: int
    ld: int
    box: tuple[int, int]
    itemsize: int = 4
    swizzle_128b: bool = False


Arg = Scalar | Pointer | Aligned16 | TensorMap2D


@dataclass(frozen=True)
class Launch:
    """One kernel launch: entry point, grid, threads of a 1-D block, dynamic shared
    memory and arguments. ``after_previous``: a programmatic dependent launch of the
    launch before it in the stream (it may start as that one's blocks finish)."""

    entry: str
    grid: tuple[int, int, int]
    threads: int
    smem: int
    args: tuple[Arg, ...]
    after_previous: bool = False


@dataclass(frozen=True)
class Workspace:
    """Device memory a call needs beside its operands: ``count`` elements of ``dtype``,
    zero-filled first where ``zeroed``. ``persistent``: made (zeroed) once for the launch
    and a stream and kept from call to call; the kernels leave it as they found it (e.g.
    counters a kernel resets after use), so no call pays for zeroing it."""

    name: str
    count: int
    dtype: np.dtype = np.dtype(np.float32)
    zeroed: bool = False
    persistent: bool = False


@dataclass(frozen=True)
class LaunchPlan:
    """The launches of one call, in stream order, and the workspaces they use.

    ``chunks``: where the call is pipelined in chunks of M rows, each chunk's rows; the
    runtime then runs the plan of each chunk's rows (A and C offset to the chunk) on two
    streams in turns, chunk 1's first launch ``chunk_delay_ns`` after chunk 0's first
    ends. ``instead``: a configuration to run in this one's place for this call (one the
    call's operands suit better, e.g. where A's alignment rules out a copy engine)."""

    launches: tuple[Launch, ...]
    workspaces: tuple[Workspace, ...] = ()
    chunks: tuple[int, ...] = ()
    chunk_delay_ns: int = 0
    instead: Any = None


@dataclass(frozen=True)
class Call:
    """What a plan depends on of a call: the rows of A (M), A's leading dimension in
    elements and whether A's address is 16-byte aligned."""

    rows: int
    lda: int
    a_aligned: bool


@dataclass(frozen=True)
class Device:
    """What a plan may ask of the device: its SMs, and how many blocks of an entry point
    (threads, dynamic shared memory) fit on one SM at once."""

    sms: int
    resident_blocks: Callable[[str, int, int], int]
