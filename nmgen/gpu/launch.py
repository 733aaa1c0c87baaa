"""Compiling through NVRTC and launching: the one module that needs CuPy and a GPU.

``Kernel(config)(a, b)`` checks its inputs, prepares the weight's kernel-side layout once
per device (cached on the ``NMMatrix``), and launches on the caller's stream. CuPy arrays
and PyTorch CUDA tensors both work; the output is of the same kind as ``a``.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ..codegen import COPY_A_THREADS, COPY_A_TILE, KernelSource, render
from ..config import ALayout, Arch, KernelConfig
from ..copy_plan import copy_chunk_rows, copy_chunks
from ..format import NMMatrix
from ..model import arch_of_capability, blocks_per_sm, gpu_of_device_name, gpu_spec
from ..prepare import LayoutKey, prepare_layout
from .tma import TensorMap, addressable, encode_matrix

NVRTC_OPTIONS = ("-std=c++17",)
_LOCK = threading.Lock()


@functools.cache  # on every launch: a cached call costs less than the import statement
def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise RuntimeError(
            "launching needs CuPy: pip install 'nmgen[cuda12]' or 'nmgen[cuda13]'"
        ) from exc
    return cupy


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "is_cuda")


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    sms: int
    major: int
    minor: int
    cuda_version: int  # CUDA runtime version, e.g. 13000

    @property
    def arch(self) -> Arch:
        return arch_of_capability(self.major, self.minor)


_DEVICE_INFO: dict[int, DeviceInfo] = {}


def device_count() -> int:
    """How many CUDA GPUs this process sees (0 without CuPy or a driver)."""
    try:
        return _cupy().cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device: all mean "none here"
        return 0


def device_info() -> DeviceInfo:
    """The current device, queried once per device."""
    cp = _cupy()
    device = cp.cuda.Device().id
    info = _DEVICE_INFO.get(device)
    if info is None:
        props = cp.cuda.runtime.getDeviceProperties(device)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        info = DeviceInfo(name, props["multiProcessorCount"], props["major"], props["minor"],
                          cp.cuda.runtime.runtimeGetVersion())
        _DEVICE_INFO[device] = info
    return info


@dataclass
class DeviceLayout:
    """A prepared layout uploaded to one device."""

    values: Any
    pos: Any
    rows: Any
    host_seconds: float  # building the layout on the host
    upload_seconds: float  # copying it to the device


def device_layout(b: NMMatrix, config: KernelConfig) -> DeviceLayout:
    """The weight's layout for ``config`` on the current device, prepared once and cached."""
    cp = _cupy()
    key = (LayoutKey.of(config), cp.cuda.Device().id)
    with _LOCK:
        cached = b._prepared.get(key)
        if cached is not None:
            return cached
        host = prepare_layout(b, config)
        start = time.perf_counter()
        rows = host.rows if host.rows is not None else np.zeros(1, np.int32)
        layout = DeviceLayout(cp.asarray(host.values), cp.asarray(host.pos), cp.asarray(rows),
                              host.seconds, 0.0)
        cp.cuda.Stream.null.synchronize()
        layout.upload_seconds = time.perf_counter() - start
        b._prepared[key] = layout
        return layout


class Operand(NamedTuple):
    """What a launch needs of an array: pointer, shape, byte strides, device, dtype."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    device: int
    float32: bool
    torch: bool


_F32 = np.dtype(np.float32)


def operand(x: Any, what: str) -> Operand:
    """Read an operand from a CuPy array or a CUDA PyTorch tensor (no copies)."""
    cp = _cupy()
    if isinstance(x, cp.ndarray):
        return Operand(x.data.ptr, x.shape, x.strides, x.device.id, x.dtype == _F32, False)
    if _is_torch(x):
        if not x.is_cuda:
            raise ValueError(f"{what} is a CPU tensor: move it to the GPU (tensor.cuda())")
        import torch

        size = x.element_size()
        return Operand(x.data_ptr(), tuple(x.shape), tuple(st * size for st in x.stride()),
                       x.get_device(), x.dtype is torch.float32, True)
    if isinstance(x, np.ndarray):
        raise TypeError(f"{what} is a NumPy array: pass a CuPy array or a CUDA torch.Tensor")
    raise TypeError(f"{what}: expected a CuPy array or a CUDA torch.Tensor, got {type(x)}")


def _params(args: list[ctypes._SimpleCData]) -> ctypes.Array:
    """The ``void**`` block ``cuLaunchKernel`` takes, pointing at ``args`` in place."""
    return (ctypes.c_void_p * len(args))(*[ctypes.addressof(v) for v in args])


def _launch(function: Any, grid: tuple[int, int, int], threads: int, smem: int,
            params: ctypes.Array, stream_ptr: int) -> None:
    """``cuLaunchKernel`` of a 1-D block of ``threads``."""
    _cupy().cuda.driver.launchKernel(function.ptr, *grid, threads, 1, 1, smem, stream_ptr,
                                     ctypes.addressof(params), 0)


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, then a 64-byte union, held as ints so that an element
    set by index lands in the structure (a ``c_char`` array field reads back as a copy)."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig."""

    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("count", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


@functools.cache
def _launch_kernel_ex() -> Any:
    function = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    function.restype = ctypes.c_int
    return function


class _AfterCopyLaunch:
    """A main kernel's launch as a programmatic dependent launch of the kernel before it in
    the stream (A's copy, ``KernelConfig.waits_for_copy``): it may start as the copy's
    blocks finish, and waits for the copy's writes at its top. A kernel launched so after
    another kind of work in the stream starts as usual."""

    def __init__(self, grid: tuple[int, int, int], threads: int, smem: int) -> None:
        self.attribute = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
        self.attribute.value[0] = 1  # programmaticStreamSerializationAllowed
        self.config = _LaunchConfig((ctypes.c_uint * 3)(*grid),
                                    (ctypes.c_uint * 3)(threads, 1, 1), smem, None,
                                    ctypes.pointer(self.attribute), 1)

    def __call__(self, function: Any, params: ctypes.Array, stream_ptr: int) -> None:
        self.config.stream = stream_ptr
        status = _launch_kernel_ex()(ctypes.byref(self.config), ctypes.c_void_p(function.ptr),
                                     ctypes.c_void_p(ctypes.addressof(params)), None)
        if status:
            raise RuntimeError(f"cuLaunchKernelEx of an nmgen kernel failed: CUresult {status}")


@dataclass
class CopyA:
    """The transpose kernel of a ``tx`` configuration: row-major A (M×K) to a K-major
    workspace of K rows of ``ld`` floats, which the main kernel then reads."""

    function: Any
    grid: tuple[int, int, int]
    ld: int
    args: list[ctypes._SimpleCData]  # A, workspace, M, K, lda, ld

    def __post_init__(self) -> None:
        self.params = _params(self.args)


_C_VEC4 = 14  # index of the main kernel's c_vec4 argument
TMA_MAPS_KEPT = 4


@dataclass
class TmaA:
    """A ``tma`` kernel's tensor map of A (an argument of its launch), encoded again
    whenever A's address changes."""

    map: ctypes.Array
    cols: int  # M
    rows: int  # K
    ld: int
    box: tuple[int, int]  # (MS, KS)
    ptr: int = -1
    # The maps of the last few addresses: a pipelined copy's chunks take two workspaces in
    # turns, and copying a map back costs less than encoding it again.
    encoded: dict[int, bytes] = field(default_factory=dict)

    def point_at(self, ptr: int) -> None:
        if ptr == self.ptr:
            return
        cached = self.encoded.get(ptr)
        if cached is not None:
            ctypes.memmove(self.map, cached, ctypes.sizeof(self.map))
        else:
            encode_matrix(self.map, ptr, self.cols, self.rows, self.ld, self.box)
            if len(self.encoded) >= TMA_MAPS_KEPT:
                self.encoded.pop(next(iter(self.encoded)))
            self.encoded[ptr] = bytes(self.map)
        self.ptr = ptr


class LaunchPlan:
    """Everything about a launch that depends only on (kernel, weight, device, M, lda):
    the argument block is packed once, and a call rewrites the A and C pointers in place
    and hands it to ``cuLaunchKernel`` (CuPy's generic argument packing costs more than
    the rest of the call)."""

    def __init__(self, main: Any, reduce: Any, grid: tuple[int, int, int], threads: int,
                 smem: int, args: list[ctypes._SimpleCData], c_vec4_ok: bool,
                 reduce_grid: int, copy_a: CopyA | None = None, stream_k: bool = False,
                 tma_a: TmaA | None = None, after_copy: bool = False):
        self.main, self.reduce, self.copy_a = main, reduce, copy_a
        # KernelConfig.waits_for_copy: the main kernel as a programmatic dependent launch
        self.after_copy = _AfterCopyLaunch(grid, threads, smem) if after_copy else None
        self.grid, self.threads, self.smem = grid, threads, smem
        # A, B', POS, ROWS, C, the scalars up to c_vec4 (_C_VEC4); stream-K adds the
        # partial-sum workspace, the flags and the tile counts; TMA the tensor maps of A
        # and B'.
        self.args = args
        self.tma_a = tma_a
        self.stream_k = stream_k
        self.params = _params(args)
        self.c_vec4_ok = c_vec4_ok
        self.reduce_grid = reduce_grid
        # Row-major A copied in chunks of these rows, pipelined (Kernel._plan, nmgen.copy_plan);
        # empty or one chunk: not. chunk_rows: the chunk this launch's M would be cut in.
        self.chunks: list[int] = []
        self.chunk_rows = 0
        # Workspaces of launches captured into CUDA graphs (``_scratch``): a replay writes
        # them, so they never go back to a pool.
        self.kept: list[Any] = []
        self.lock = threading.Lock()

    def launch(self, a_ptr: int, c_ptr: int, stream_ptr: int,
               scratch: tuple[int, int] = (0, 0)) -> None:
        """``scratch``: stream-K's partial-sum workspace and zeroed flags."""
        with self.lock:  # the argument block is shared by the threads of the process
            self.args[0].value = a_ptr
            self.args[4].value = c_ptr
            self.args[_C_VEC4].value = self.c_vec4_ok and c_ptr % 16 == 0
            if self.tma_a is not None:
                self.tma_a.point_at(a_ptr)
            if self.stream_k:
                self.args[_C_VEC4 + 1].value, self.args[_C_VEC4 + 2].value = scratch
            if self.after_copy is not None:
                self.after_copy(self.main, self.params, stream_ptr)
            else:
                _launch(self.main, self.grid, self.threads, self.smem, self.params, stream_ptr)

    def launch_copy_a(self, a_ptr: int, copy_ptr: int, stream_ptr: int) -> None:
        copy = self.copy_a
        with self.lock:
            copy.args[0].value = a_ptr
            copy.args[1].value = copy_ptr
            _launch(copy.function, copy.grid, COPY_A_THREADS, 0, copy.params, stream_ptr)


def stream_k_grid(tiles: int, stages: int, resident: int) -> tuple[int, int]:
    """(blocks, whole tiles) of a stream-K launch: as many blocks as fit on the GPU at
    once (``resident``), at most one a stage; they run all full waves of tiles but the last
    whole, round robin, and share the stages of the rest out evenly. Sharing the last full
    wave too was 0.2-1 % faster at 4096^3 and 1-2 % at 1024x6656x6656 (H100,
    results/stream_k_h100/), and gives each block at least one tile's stages."""
    blocks = min(resident, tiles * stages)
    return blocks, max(0, tiles // blocks - 1) * blocks


# A one-thread kernel that waits on the GPU's nanosecond timer. The timing queues it before
# each timed call (so that the events bracket the device work alone, not the host's launch
# path); the pipelined copy of row-major A puts it before copy 1 (_run_pipelined).
_WAIT_SOURCE = r"""
extern "C" __global__ void nmgen_wait_ns(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


@functools.cache
def _wait_kernel() -> Any:
    return _cupy().RawKernel(_WAIT_SOURCE, "nmgen_wait_ns")


# How long copy 1 of a pipelined call waits after copy 0 ends, on the GPU: long enough for
# main kernel 0's blocks to take the SMs first (waits of 2 to 20 us read the same on the
# H100, results/copy_order_h100/).
COPY_1_DELAY_NS = 2000

_SECOND_STREAMS: dict[int, Any] = {}


def _second_stream(device: int) -> Any:
    """The second stream of ``device``'s pipelined calls (the caller's is the first), made
    once: non-blocking, of the least priority, as a caller's stream usually is. Two
    streams of the greatest priority beside the caller's were 0.2-0.4 % slower at 4096^3
    (results/caller_stream_h100/)."""
    cached = _SECOND_STREAMS.get(device)
    if cached is None:
        cp = _cupy()
        with cp.cuda.Device(device):
            cached = cp.cuda.Stream(non_blocking=True, priority=_priority_range()[0])
        _SECOND_STREAMS[device] = cached
    return cached


def _priority_range() -> tuple[int, int]:
    """(least, greatest) stream priority of the current device; where CuPy does not ask
    the runtime, CUDA's usual range (the driver clamps a value outside its own)."""
    runtime = _cupy().cuda.runtime
    if hasattr(runtime, "deviceGetStreamPriorityRange"):
        return runtime.deviceGetStreamPriorityRange()
    return 0, -5  # pragma: no cover - depends on the CuPy version


def _record(stream: Any) -> Any:
    event = _cupy().cuda.Event(disable_timing=True)
    event.record(stream)
    return event


@functools.cache  # looked up once, not on every launch
def _capture_status() -> Callable[[int], int]:
    """``stream -> cudaStreamIsCapturing`` status (0: not capturing); always 0 where CuPy
    does not offer the call."""
    return getattr(_cupy().cuda.runtime, "streamIsCapturing", lambda stream: 0)


def _capturing(stream_ptr: int) -> bool:
    """Whether work queued on the stream goes into a CUDA graph being captured."""
    return _capture_status()(stream_ptr) != 0


def _scratch(plan: LaunchPlan, a_op: Operand, capturing: bool, count: int,
             dtype: Any = np.float32, zeroed: bool = False) -> tuple[Any, int]:
    """(array, address) of a launch's workspace of ``count`` elements, on the current
    stream; the caller holds the array until its launches are queued. Outside graph
    capture it comes from CuPy's pool, which hands it out again only after the work
    queued on that stream so far. A captured launch's workspace is written by every
    replay, long after the call, so it is kept on the launch plan for as long as the
    weight (capture a launch once and replay it). For a PyTorch caller it then comes from
    torch's allocator: inside ``torch.cuda.graph`` that is the graph's own pool, where
    CuPy's could not allocate."""
    if capturing and a_op.torch:
        import torch

        make = torch.zeros if zeroed else torch.empty
        tensor = make(count, dtype=torch.int32 if dtype == np.int32 else torch.float32,
                      device=f"cuda:{a_op.device}")
        plan.kept.append(tensor)
        return tensor, tensor.data_ptr()
    cp = _cupy()
    try:
        array = (cp.zeros if zeroed else cp.empty)(count, dtype)
    except cp.cuda.runtime.CUDARuntimeError as exc:
        if not capturing:
            raise
        raise RuntimeError(
            "nmgen could not allocate a workspace while a CUDA graph was being captured "
            f"({exc}); make the same call once on this stream before capturing, so that "
            "CuPy's pool holds the memory, or capture in relaxed mode") from exc
    if capturing:
        plan.kept.append(array)
    return array, array.data.ptr


def _resident_blocks(function: Any, config: KernelConfig) -> int:
    """Blocks of ``function`` that fit on one SM at once (the driver's occupancy
    calculator; the model's estimate where CuPy does not offer it)."""
    occupancy = getattr(_cupy().cuda.driver, "occupancyMaxActiveBlocksPerMultiprocessor", None)
    if occupancy is None:  # pragma: no cover - depends on the CuPy version
        gpu = gpu_of_device_name(device_info().name)
        return blocks_per_sm(config, gpu_spec(gpu)) if gpu else 1
    return max(1, occupancy(function.ptr, config.threads, config.smem_bytes))


_STREAMS: dict[int, Any] = {}


class Kernel:
    """One compiled configuration: ``Kernel(config)(a, b, out=None, stream=None)``."""

    def __init__(self, config: KernelConfig, source: KernelSource | None = None):
        """``source``: another version of ``config``'s code (the A/B tools time template
        variants under one name); by default the template's."""
        if source is not None and source.config != config:
            raise ValueError(f"source of {source.config.name} given for {config.name}")
        self.config = config
        self._source = render(config) if source is None else source
        # Launch plans are cached on the weight, keyed by this, so that two versions of
        # one configuration never share a compiled function.
        self._source_key = self._source.sha256
        self._functions: dict[int, tuple[Any, Any]] = {}
        # What passed the checks of A and of out that do not change from call to call
        # (shapes, strides, dtypes, the weight's pattern): the hot path looks them up.
        self._a_checked: dict[tuple, tuple[int, int]] = {}
        self._out_checked: set[tuple] = set()
        self._twin: Kernel | None = None
        # Row-major A copied K-major first (tx) runs pipelined in chunks where
        # nmgen.copy_plan says so; False: one copy, then one main kernel (the A/B tools).
        self.pipeline_copy = True

    @property
    def source(self) -> KernelSource:
        """The code this kernel compiles; read-only, as the launch-plan key is its hash."""
        return self._source

    @property
    def name(self) -> str:
        return self.config.name

    def _compiled(self, device: int) -> tuple[Any, Any, Any]:
        """(main, reduce, transpose) functions for ``device`` (``None`` where the
        configuration has none), compiled once (CuPy caches NVRTC output on disk, keyed by
        source, options, arch and compiler version)."""
        cp = _cupy()
        with _LOCK:
            if device not in self._functions:
                module = cp.RawModule(code=self.source.code, options=NVRTC_OPTIONS,
                                      backend="nvrtc")
                main = module.get_function(self.name)
                if self.config.smem_bytes > 48 * 1024:
                    main.max_dynamic_shared_size_bytes = self.config.smem_bytes

                def helper(suffix: str, present: bool) -> Any:
                    return module.get_function(self.name + suffix).kernel if present else None

                self._functions[device] = (main.kernel,
                                           helper("_reduce", self.config.split_k > 1),
                                           helper("_transpose", self.config.a_copied))
            return self._functions[device]

    def _plan(self, b: NMMatrix, device: int, m_rows: int, lda: int, a_aligned: bool
              ) -> LaunchPlan:
        c = self.config
        main, reduce, transpose = self._compiled(device)
        layout = device_layout(b, c)
        k_dim, n_cols = b.shape
        u64, i32, i64 = ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64
        copy_a = None
        if transpose is not None:  # the main kernel reads an aligned K-major copy
            ld = -(-m_rows // 4) * 4
            copy_a = CopyA(transpose, (-(-k_dim // COPY_A_TILE), -(-ld // COPY_A_TILE), 1), ld,
                           [u64(0), u64(0), i32(m_rows), i32(k_dim), i64(lda), i64(ld)])
            lda, a_aligned = ld, True  # the workspace comes from CuPy's pool: 256-B aligned
        # 16-byte copies along A's contiguous dimension need it and the rows aligned.
        extent = k_dim if c.kernel_a_layout is ALayout.ROW_MAJOR else m_rows
        a_vec4 = extent % 4 == 0 and lda % 4 == 0 and a_aligned
        stages_total = layout.pos.shape[1]
        ldb = layout.values.shape[1]
        args = [u64(0), u64(layout.values.data.ptr), u64(layout.pos.data.ptr),
                u64(layout.rows.data.ptr), u64(0), i32(m_rows), i32(n_cols), i32(k_dim),
                i64(lda), i64(ldb), i64(n_cols), i32(stages_total),
                i32(-(-stages_total // c.split_k)), i32(a_vec4), i32(0)]
        sms = device_info().sms
        grid = (ldb // c.ns, -(-m_rows // c.ms), c.split_k)
        if c.stream_k:  # a persistent grid: as many blocks as fit at once, at most one a stage
            tiles = grid[0] * grid[1]
            if tiles * stages_total >= 2**31:  # the kernel counts stages in 32 bits
                raise ValueError(f"{c.name}: {tiles} tiles of {stages_total} stages are too "
                                 "many for the stream-K grid; use a data-parallel kernel")
            blocks, whole_tiles = stream_k_grid(tiles, stages_total,
                                                sms * _resident_blocks(main, c))
            args += [u64(0), u64(0), i32(grid[0]), i32(grid[1]), i32(whole_tiles)]
            grid = (blocks, 1, 1)
        tma_a = None
        if c.tma:  # B''s map now; A's at the launch (its address), where the engine can read it
            map_a, map_b = TensorMap(), TensorMap()
            encode_matrix(map_b, layout.values.data.ptr, ldb, layout.values.shape[0], ldb,
                          (c.ns, c.ws))
            args += [map_a, map_b]
            tma_a = TmaA(map_a, m_rows, k_dim, lda, (c.ms, c.ks))
        plan = LaunchPlan(main, reduce, grid, c.threads, c.smem_bytes, args, n_cols % 4 == 0,
                          max(1, min(-(-m_rows * n_cols // 256), sms * 16)), copy_a,
                          c.stream_k, tma_a, c.waits_for_copy)
        if copy_a is not None and reduce is None and not c.stream_k:
            plan.chunk_rows = int(copy_chunk_rows(k_dim, c.ms, grid[0],
                                                  sms * _resident_blocks(main, c)))
            plan.chunks = copy_chunks(m_rows, plan.chunk_rows)
        return plan

    def __call__(self, a: Any, b: NMMatrix, out: Any = None, stream: Any = None) -> Any:
        return self.run(a, operand(a, "a"), b, out, stream)

    def run(self, a: Any, a_op: Operand, b: NMMatrix, out: Any, stream: Any) -> Any:
        """The launch, given ``a``'s operand already read (the dispatcher reads it)."""
        cp = _cupy()
        m_rows, lda = self._check_a(a_op, b)
        n_cols = b.shape[1]
        out, c_op = _output(out, a, a_op, (m_rows, n_cols), self._out_checked)
        if m_rows == 0:
            return out
        if self.config.tma and not self.config.a_copied and not addressable(a_op.ptr, lda):
            return self._cp_async_twin().run(a, a_op, b, out, stream)
        handle = _stream(stream, a_op)
        stream_ptr = _current_stream_ptr() if handle is None else handle.ptr
        plan = self._cached_plan(b, a_op, m_rows, lda, stream_ptr)
        if plan.reduce is None and plan.copy_a is None and not plan.stream_k:
            plan.launch(a_op.ptr, c_op.ptr, stream_ptr)
            return out
        if len(plan.chunks) > 1 and self.pipeline_copy:
            self._run_pipelined(plan, a_op, lda, b, c_op.ptr, handle)
            return out
        capturing = _capturing(stream_ptr)
        with handle if handle is not None else cp.cuda.get_current_stream():
            a_ptr = a_op.ptr
            if plan.stream_k:  # a partial-sum slot and a flag a block; flags start at 0
                blocks = plan.grid[0]  # (zeroed before the copy, which the kernel follows)
                partials, partials_ptr = _scratch(plan, a_op, capturing,
                                                  blocks * self.config.ms * self.config.ns)
                flags, flags_ptr = _scratch(plan, a_op, capturing, blocks, np.int32, True)
            if plan.copy_a is not None:
                a_copy, a_ptr = _scratch(plan, a_op, capturing, b.shape[0] * plan.copy_a.ld)
                plan.launch_copy_a(a_op.ptr, a_ptr, stream_ptr)
            if plan.stream_k:
                plan.launch(a_ptr, c_op.ptr, stream_ptr, (partials_ptr, flags_ptr))
                return out
            if plan.reduce is None:
                plan.launch(a_ptr, c_op.ptr, stream_ptr)
                return out
            workspace, workspace_ptr = _scratch(plan, a_op, capturing,
                                                self.config.split_k * m_rows * n_cols)
            plan.launch(a_ptr, workspace_ptr, stream_ptr)
            plan.reduce((plan.reduce_grid,), (256,), (np.uint64(workspace_ptr),
                                                     np.uint64(c_op.ptr), np.int32(m_rows),
                                                     np.int32(n_cols), np.int64(n_cols)),
                        0, handle)
        return out

    def _cached_plan(self, b: NMMatrix, a_op: Operand, m_rows: int, lda: int,
                     stream_ptr: int | None = None) -> LaunchPlan:
        """The launch plan, built on the first call (``stream_ptr``: the launch stream,
        which must not be capturing a CUDA graph then)."""
        key = ("plan", self._source_key, a_op.device, m_rows, lda, a_op.ptr % 16 == 0)
        plan = b._prepared.get(key)
        if plan is None:
            if stream_ptr is not None and _capturing(stream_ptr):
                raise RuntimeError(
                    f"{self.name}: the first call for this weight and M = {m_rows} compiles "
                    "the kernel and lays the weight out on the GPU, which cannot be done "
                    "while a CUDA graph is being captured; make the same call once before "
                    "capturing")
            plan = b._prepared[key] = self._plan(b, a_op.device, m_rows, lda, key[-1])
        return plan

    def _run_pipelined(self, whole: LaunchPlan, a_op: Operand, lda: int, b: NMMatrix,
                       c_ptr: int, handle: Any) -> None:
        """Row-major A copied and multiplied in chunks of rows. Stream j % 2 of two, the
        caller's and ``_second_stream``, runs chunk j's copy, then its main kernel, so that
        copy j overlaps main kernel j-1 (on the other stream), main kernel j follows its
        copy in stream order, and copy j follows main kernel j-2, which read the same one of
        the two K-major workspaces. The only wait between the two streams before the end is
        copy 1's: it follows copy 0 (and so the caller's work before this call),
        COPY_1_DELAY_NS later on the GPU, so that main kernel 0's blocks take the SMs first
        and copy 1 runs in the slots they leave. The caller's stream then waits for the
        second's, so work queued on it after this call, and the pool's reuse of the
        workspaces, come after both. Waits between streams cost time on the GPU: two
        pipeline streams of their own, which waited for the caller's before copy 0 and
        which it waited for at the end, were 0.2-0.4 % slower (results/caller_stream_h100/)."""
        cp = _cupy()
        caller = handle if handle is not None else cp.cuda.get_current_stream()
        streams = (caller, _second_stream(a_op.device))
        chunks = whole.chunks
        plans = {rows: self._cached_plan(b, a_op, rows, lda, caller.ptr) for rows in set(chunks)}
        depth, n_cols = b.shape
        capturing = _capturing(caller.ptr)
        with caller:
            words = depth * max(plan.copy_a.ld for plan in plans.values())
            # (array, address) pairs: the arrays are held until every launch is queued
            spaces = [_scratch(whole, a_op, capturing, words) for _ in range(2)]
        copy_0, first = None, 0
        for j, rows in enumerate(chunks):
            plan, space, stream = plans[rows], spaces[j % 2][1], streams[j % 2]
            if j == 1:
                stream.wait_event(copy_0)
                _wait_kernel()((1,), (1,), (np.uint64(COPY_1_DELAY_NS),), stream=stream)
            plan.launch_copy_a(a_op.ptr + 4 * first * lda, space, stream.ptr)
            if j == 0:
                copy_0 = _record(stream)
            plan.launch(space, c_ptr + 4 * first * n_cols, stream.ptr)
            first += rows
        caller.wait_event(_record(streams[1]))

    def _cp_async_twin(self) -> Kernel:
        """``KernelConfig.cp_async_twin``: what a ``tma`` kernel runs on an A that the
        bulk copy engine cannot address."""
        if self._twin is None:
            self._twin = Kernel(self.config.cp_async_twin())
        return self._twin

    def _check_a(self, a_op: Operand, b: NMMatrix) -> tuple[int, int]:
        """``_check_a``, remembered for what it depends on but the pointer and the device,
        which are checked on every call."""
        if isinstance(b, NMMatrix):
            key = (a_op.shape, a_op.strides, a_op.float32, b.n, b.m, b.vec, b.shape[0])
            checked = self._a_checked.get(key)
            if checked is not None:
                _check_placement(a_op)
                return checked
            checked = self._a_checked[key] = _check_a(a_op, b, self.config)
            return checked
        return _check_a(a_op, b, self.config)  # raises


def _check_placement(a: Operand) -> None:
    current = _cupy().cuda.runtime.getDevice()
    if a.device != current:
        raise ValueError(f"a is on GPU {a.device} but the current device is {current}")
    if a.ptr % 4:
        raise ValueError("a's data pointer is not 4-byte aligned")


def _check_a(a: Operand, b: NMMatrix, config: KernelConfig) -> tuple[int, int]:
    """Validate ``a`` (logical ``M×K``) against the weight and the kernel; return
    ``(M, lda)`` with ``lda`` in elements."""
    if not isinstance(b, NMMatrix):
        raise TypeError(f"b must be an nmgen.NMMatrix (see nmgen.prune), got {type(b)}")
    if (b.n, b.m, b.vec) != (config.n, config.m, config.vec):
        raise ValueError(f"kernel {config.name} is for {config.n}:{config.m} L={config.vec}; "
                         f"b is {b.pattern} L={b.vec}")
    if not a.float32:
        raise TypeError("a must be float32: this kernel family takes float32")
    if len(a.shape) != 2:
        raise ValueError(f"a must be 2-D (M×K), got shape {a.shape}")
    m_rows, k_dim = a.shape
    if k_dim != b.shape[0]:
        raise ValueError(f"a is {m_rows}×{k_dim} but b is {b.shape[0]}×{b.shape[1]}: "
                         "a's K must equal b's K")
    _check_placement(a)
    row_major = config.a_layout is ALayout.ROW_MAJOR
    inner, outer = (1, 0) if row_major else (0, 1)
    extent = k_dim if row_major else m_rows
    if m_rows and k_dim and (a.strides[inner] != 4 or a.strides[outer] < 4 * extent
                             or a.strides[outer] % 4):
        want = ("row-major M×K (C-contiguous, a K stride of 1)" if row_major
                else "K-major: an M×K view whose M stride is 1, e.g. a_kxm.T")
        raise ValueError(f"a has strides {a.strides}; kernel {config.name} needs A {want}")
    return m_rows, (a.strides[outer] // 4 if m_rows and k_dim else max(extent, 1))


def _output(out: Any, a: Any, a_op: Operand, shape: tuple[int, int],
            checked: set[tuple] | None = None) -> tuple[Any, Operand]:
    """(what the caller gets, its operand): ``out`` checked, or a new array of ``a``'s kind.
    ``checked`` remembers what passed (shape, dtype, strides, devices)."""
    if out is None:
        if a_op.torch:
            import torch

            out = torch.empty(shape, dtype=torch.float32, device=a.device)
        else:
            cp = _cupy()
            out = cp.empty(shape, np.float32)
        return out, operand(out, "out")
    c = operand(out, "out")
    key = (c.shape, c.float32, c.strides, c.device, a_op.device, shape)
    if checked is not None and key in checked:
        return out, c
    if tuple(c.shape) != shape:
        raise ValueError(f"out has shape {tuple(c.shape)}; the product is "
                         f"{shape[0]}×{shape[1]}")
    if not c.float32:
        raise TypeError("out has the wrong dtype; expected float32")
    if shape[0] and shape[1] and c.strides != (4 * shape[1], 4) and shape[0] > 1:
        raise ValueError("out must be C-contiguous (row-major M×N)")
    if c.device != a_op.device:
        raise ValueError(f"out is on GPU {c.device}, a on GPU {a_op.device}")
    if checked is not None:
        checked.add(key)
    return out, c


def _current_stream_ptr() -> int:
    stream_module = _cupy().cuda.stream
    if hasattr(stream_module, "get_current_stream_ptr"):
        return stream_module.get_current_stream_ptr()
    return _cupy().cuda.get_current_stream().ptr


@functools.cache  # looked up once, not on every launch
def _torch_stream_handle_of() -> Callable[[int], int]:
    """``device -> raw handle of PyTorch's current stream there``: torch's private accessor
    where it exists, as Triton's launcher does (building a ``torch.cuda.Stream`` costs
    microseconds a call)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw or (lambda device: torch.cuda.current_stream(device).cuda_stream)


def _stream(stream: Any, a: Operand) -> Any:
    """The CuPy stream to launch on: ``stream`` (CuPy, torch or a raw handle), else the
    caller's current stream (torch's for torch tensors; ``None`` means CuPy's current)."""
    if stream is None:
        if not a.torch:
            return None
        return _external_stream(_torch_stream_handle_of()(a.device))
    cp = _cupy()
    if isinstance(stream, cp.cuda.Stream | getattr(cp.cuda, "ExternalStream", cp.cuda.Stream)):
        return stream
    return _external_stream(int(getattr(stream, "cuda_stream", stream)))


class _RawStream:
    """A raw ``cudaStream_t`` in the CUDA stream protocol, which CuPy's
    ``Stream.from_external`` takes (it replaces ``ExternalStream``, deprecated in CuPy 14)."""

    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _external_stream(handle: int) -> Any:
    """A CuPy stream object for a raw handle, made once a handle."""
    cached = _STREAMS.get(handle)
    if cached is None:
        stream_class = _cupy().cuda.Stream
        if hasattr(stream_class, "from_external"):
            cached = stream_class.from_external(_RawStream(handle))
        else:  # pragma: no cover - CuPy before 14
            cached = _cupy().cuda.ExternalStream(handle)
        _STREAMS[handle] = cached
    return cached
