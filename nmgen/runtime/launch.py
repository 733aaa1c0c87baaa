"""Running a kernel: ``Kernel(config)(a, b)`` checks its operands, prepares the weight's
kernel-side layout once per device (cached on the ``NMMatrix``), asks the family for the
call's launch plan (``nmgen.families.plan``) and turns it into driver launches on the
caller's stream.

A plan is bound once per (kernel, weight, device, M, lda, A's alignment): its argument
blocks are packed then, and a call only writes the addresses of A, C and the workspaces
into them before ``cuLaunchKernel`` (CuPy's generic argument packing costs more than the
rest of a call). CuPy arrays and PyTorch CUDA tensors both work; the output is of the
same kind as ``a``. A configuration with an epilogue that adds a bias takes it as
``bias=`` (``N`` values in the kernel's dtype, on ``a``'s device).
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..codegen import KernelSource, render
from ..compiler.nvrtc import compile_module, cupy
from ..families import plan as data
from ..families.base import Config, PreparedWeight, epilogue_of
from ..families.registry import family_of
from ..format import NMMatrix
from ..problem import ALayout
from ..shapes import MAX_DIM
from . import tma
from .device import (
    Operand,
    capturing,
    current_device,
    current_stream_ptr,
    device_info,
    empty_like_caller,
    launch_stream,
    operand,
    record,
    second_stream,
    upload,
)

_LOCK = threading.Lock()
_CTYPES = {"i32": ctypes.c_int32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64}
SMEM_WITHOUT_OPT_IN = 47 * 1024  # 48 KB, less room for a kernel's static shared memory


# ------------------------------------------------------------------------ the weight
@dataclass
class DeviceWeight:
    """A prepared weight uploaded to one device: its arrays by name."""

    arrays: dict[str, Any]
    host_seconds: float  # building the layout on the host
    upload_seconds: float  # copying it to the device

    def ptr(self, name: str) -> int:
        return self.arrays[name].data.ptr


def device_weight(b: NMMatrix, config: Config) -> tuple[DeviceWeight, PreparedWeight]:
    """The weight's layout for ``config`` on the current device and on the host, prepared
    once and cached on the weight."""
    family = family_of(config)
    key = (family.name, family.layout_key(config), current_device())
    with _LOCK:
        cached = b._prepared.get(key)
        if cached is None:
            host = family.prepare(b, config)
            cached = b._prepared[key] = (_uploaded(host), host)
        return cached


def _uploaded(host: PreparedWeight) -> DeviceWeight:
    """``host``'s arrays on the current device, timed."""
    start = time.perf_counter()
    weight = DeviceWeight({name: upload(a) for name, a in host.arrays.items()},
                          host.seconds, 0.0)
    cupy().cuda.Stream.null.synchronize()
    weight.upload_seconds = time.perf_counter() - start
    return weight


def upload_layouts(source: NMMatrix, target: NMMatrix) -> None:
    """Gives ``target``, a copy of ``source``'s weight, a device copy of its own of every
    layout ``source`` holds and it lacks, from ``source``'s host arrays (not prepared
    again: a bench's rotated copies of one weight)."""
    with _LOCK:
        for key, cached in list(source._prepared.items()):
            if key not in target._prepared and isinstance(cached, tuple):  # not a plan
                target._prepared[key] = (_uploaded(cached[1]), cached[1])


# ------------------------------------------------------------------------ launches
def _params(args: list[ctypes._SimpleCData]) -> ctypes.Array:
    """The ``void**`` block ``cuLaunchKernel`` takes, pointing at ``args`` in place."""
    return (ctypes.c_void_p * len(args))(*[ctypes.addressof(v) for v in args])


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


class _AfterPreviousLaunch:
    """A launch as a programmatic dependent launch of the kernel before it in the stream
    (``Launch.after_previous``): it may start as that kernel's blocks finish, and waits
    for its writes itself (``griddepcontrol.wait``). After another kind of work in the
    stream it starts as usual."""

    def __init__(self, grid: tuple[int, int, int], threads: int, smem: int) -> None:
        self.attribute = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
        self.attribute.value[0] = 1  # programmaticStreamSerializationAllowed
        self.config = _LaunchConfig((ctypes.c_uint * 3)(*grid),
                                    (ctypes.c_uint * 3)(threads, 1, 1), smem, None,
                                    ctypes.pointer(self.attribute), 1)

    def __call__(self, function_ptr: int, params: ctypes.Array, stream_ptr: int) -> None:
        self.config.stream = stream_ptr
        status = _launch_kernel_ex()(ctypes.byref(self.config), ctypes.c_void_p(function_ptr),
                                     ctypes.c_void_p(ctypes.addressof(params)), None)
        if status:
            raise RuntimeError(f"cuLaunchKernelEx of an nmgen kernel failed: CUresult {status}")


TMA_MAPS_KEPT = 4


@dataclass
class _MapSlot:
    """A tensor-map argument whose buffer moves from call to call (A, a workspace):
    encoded again when the address changes; the maps of the last few addresses are kept
    (a pipelined call's chunks take two workspaces in turns, and copying a map back costs
    less than encoding it again)."""

    map: ctypes.Array
    spec: data.TensorMap2D
    ptr: int = -1
    encoded: dict[int, bytes] = field(default_factory=dict)

    def point_at(self, ptr: int) -> None:
        if ptr == self.ptr:
            return
        cached = self.encoded.get(ptr)
        if cached is not None:
            ctypes.memmove(self.map, cached, ctypes.sizeof(self.map))
        else:
            s = self.spec
            tma.encode_matrix(self.map, ptr, s.cols, s.rows, s.ld, s.box, s.itemsize,
                              s.swizzle_128b)
            if len(self.encoded) >= TMA_MAPS_KEPT:
                self.encoded.pop(next(iter(self.encoded)))
            self.encoded[ptr] = bytes(self.map)
        self.ptr = ptr


class _BoundLaunch:
    """One ``Launch`` with its argument block packed; the buffers of the weight written
    once, those of the call (``moving``) at every call."""

    def __init__(self, launch: data.Launch, function: Any, fixed: dict[str, int]):
        self.function_ptr = function.ptr
        self.grid, self.threads, self.smem = launch.grid, launch.threads, launch.smem
        self.args: list[Any] = []
        self.moving: list[tuple[ctypes._SimpleCData, str]] = []
        self.flags: list[tuple[ctypes._SimpleCData, str, bool]] = []
        self.maps: list[_MapSlot] = []
        for arg in launch.args:
            self.args.append(self._bind(arg, fixed))
        self.params = _params(self.args)
        self.after_previous = (_AfterPreviousLaunch(launch.grid, launch.threads, launch.smem)
                               if launch.after_previous else None)

    def _bind(self, arg: Any, fixed: dict[str, int]) -> Any:
        if isinstance(arg, data.Scalar):
            return _CTYPES[arg.kind](arg.value)
        if isinstance(arg, data.Pointer):
            value = ctypes.c_uint64(fixed.get(arg.buffer, 0))
            if arg.buffer not in fixed:
                self.moving.append((value, arg.buffer))
            return value
        if isinstance(arg, data.Aligned16):
            value = ctypes.c_int32(0)
            self.flags.append((value, arg.buffer, arg.allowed))
            return value
        if isinstance(arg, data.TensorMap2D):
            slot = _MapSlot(tma.TensorMap(), arg)
            if arg.buffer in fixed:
                slot.point_at(fixed[arg.buffer])
            else:
                self.maps.append(slot)
            return slot.map
        raise TypeError(f"unknown launch argument {arg!r}")

    def __call__(self, ptrs: dict[str, int], stream_ptr: int) -> None:
        for value, buffer in self.moving:
            value.value = ptrs[buffer]
        for value, buffer, allowed in self.flags:
            value.value = allowed and ptrs[buffer] % 16 == 0
        for slot in self.maps:
            slot.point_at(ptrs[slot.spec.buffer])
        if self.after_previous is not None:
            self.after_previous(self.function_ptr, self.params, stream_ptr)
        else:
            cupy().cuda.driver.launchKernel(self.function_ptr, *self.grid, self.threads, 1, 1,
                                            self.smem, stream_ptr,
                                            ctypes.addressof(self.params), 0)


class BoundPlan:
    """A family's ``LaunchPlan`` with its launches bound to compiled functions and to the
    weight on the device."""

    def __init__(self, plan: data.LaunchPlan, launches: list[_BoundLaunch]):
        self.plan = plan
        self.launches = launches
        # Workspaces of launches captured into CUDA graphs (``_workspace``): a replay
        # writes them, so they never go back to a pool.
        self.kept: list[Any] = []
        # Persistent workspaces (``Workspace.persistent``), one a (name, stream): made and
        # zeroed at a stream's first call, then the kernels keep them zeroed.
        self.persistent: dict[tuple[str, int], tuple[Any, int]] = {}
        self.lock = threading.Lock()  # the argument blocks are shared by the threads

    def run(self, ptrs: dict[str, int], stream_ptr: int, first: int = 0,
            last: int | None = None) -> None:
        with self.lock:
            for launch in self.launches[first:last]:
                launch(ptrs, stream_ptr)


# ------------------------------------------------------------------------ the kernel
class Kernel:
    """One compiled configuration: ``Kernel(config)(a, b, out=None, stream=None,
    bias=None)``."""

    def __init__(self, config: Config, source: KernelSource | None = None):
        """``source``: another version of ``config``'s code (an A/B of template variants
        under one name); by default the template's."""
        if source is not None and source.config != config:
            raise ValueError(f"source of {source.config.name} given for {config.name}")
        self.config = config
        self.family = family_of(config)
        self._source = render(config) if source is None else source
        # Bound plans are cached on the weight, keyed by this, so that two versions of
        # one configuration never share a compiled function.
        self._source_key = self._source.sha256
        self._functions: dict[int, dict[str, Any]] = {}
        # What passed the checks of A and of out that do not change from call to call
        # (shapes, strides, dtypes, the weight's pattern): the hot path looks them up.
        self._a_checked: dict[tuple, tuple[int, int]] = {}
        self._out_checked: set[tuple] = set()
        self._bias_checked: set[tuple] = set()
        self._adds_bias = epilogue_of(config).bias
        self._instead: dict[str, Kernel] = {}
        # A plan's chunks run pipelined on two streams; False: one after another on the
        # caller's stream, unchunked (comparisons of the two).
        self.pipeline = True

    @property
    def source(self) -> KernelSource:
        """The code this kernel compiles; read-only, as the plan cache key is its hash."""
        return self._source

    @property
    def name(self) -> str:
        return self.config.name

    # -------------------------------------------------------------- compiling
    def _function(self, device: int, entry: str, smem: int) -> Any:
        """The compiled ``entry`` for ``device`` (CuPy caches NVRTC output on disk, keyed
        by source, options, arch and compiler version), allowed ``smem`` bytes of dynamic
        shared memory."""
        with _LOCK:
            functions = self._functions.get(device)
            if functions is None:
                module = compile_module(self.source.code, self.source.target)
                functions = self._functions[device] = {
                    name: module.get_function(name) for name in self.family.entry_points(
                        self.config)}
            kernel = functions[entry]
            if smem > SMEM_WITHOUT_OPT_IN and kernel.max_dynamic_shared_size_bytes < smem:
                kernel.max_dynamic_shared_size_bytes = smem
            return kernel.kernel

    def _resident_blocks(self, device: int) -> Any:
        def resident(entry: str, threads: int, smem: int) -> int:
            function = self._function(device, entry, smem)
            occupancy = cupy().cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor
            return max(1, occupancy(function.ptr, threads, smem))
        return resident

    # -------------------------------------------------------------- plans
    def _bound(self, b: NMMatrix, a_op: Operand, rows: int, lda: int,
               stream_ptr: int | None = None) -> BoundPlan:
        """The bound plan, made on the first call (``stream_ptr``: the launch stream,
        which must not be capturing a CUDA graph then)."""
        key = ("plan", self._source_key, a_op.device, rows, lda, a_op.ptr % 16 == 0)
        bound = b._prepared.get(key)
        if bound is None:
            if stream_ptr is not None and capturing(stream_ptr):
                raise RuntimeError(
                    f"{self.name}: the first call for this weight and M = {rows} compiles "
                    "the kernel and lays the weight out on the GPU, which cannot be done "
                    "while a CUDA graph is being captured; make the same call once before "
                    "capturing")
            bound = b._prepared[key] = self._bind(b, a_op.device, data.Call(rows, lda, key[-1]))
        return bound

    def _bind(self, b: NMMatrix, device: int, call: data.Call) -> BoundPlan:
        weight, host = device_weight(b, self.config)
        facts = data.Device(device_info().sms, self._resident_blocks(device))
        plan = self.family.plan(self.config, host, b.shape, call, facts)
        fixed = {name: weight.ptr(name) for name in weight.arrays}
        launches = [_BoundLaunch(launch, self._function(device, launch.entry, launch.smem),
                                 fixed) for launch in plan.launches]
        return BoundPlan(plan, launches)

    def prepared(self, b: NMMatrix) -> PreparedWeight:
        """``b``'s layout for this kernel on the host (made once, on the current device)."""
        return device_weight(b, self.config)[1]

    # -------------------------------------------------------------- calls
    def __call__(self, a: Any, b: NMMatrix, out: Any = None, stream: Any = None, *,
                 bias: Any = None) -> Any:
        return self.run(a, operand(a, "a"), b, out, stream, bias)

    def run(self, a: Any, a_op: Operand, b: NMMatrix, out: Any, stream: Any,
            bias: Any = None) -> Any:
        """The call, given ``a``'s operand already read (the dispatcher reads it)."""
        rows, lda = self._check_a(a_op, b)
        out, c_op = self._output(out, a, a_op, (rows, b.shape[1]))
        bias_ptr = self._bias(bias, a_op, b.shape[1])
        if rows == 0:
            return out
        handle = launch_stream(stream, a_op)
        stream_ptr = current_stream_ptr() if handle is None else handle.ptr
        bound = self._bound(b, a_op, rows, lda, stream_ptr)
        plan = bound.plan
        if plan.instead is not None:
            return self._kernel_instead(plan.instead).run(a, a_op, b, out, stream, bias)
        ptrs = {data.A: a_op.ptr, data.C: c_op.ptr, data.BIAS: bias_ptr}
        if not plan.workspaces:
            bound.run(ptrs, stream_ptr)
        elif plan.chunks and self.pipeline:
            self._run_pipelined(bound, a_op, lda, b, ptrs, handle)
        else:
            with handle if handle is not None else cupy().cuda.get_current_stream():
                spaces = _workspaces([bound], bound, a_op, capturing(stream_ptr), stream_ptr)
                bound.run({**ptrs, **_addresses(spaces)}, stream_ptr)
        return out

    def _run_pipelined(self, whole: BoundPlan, a_op: Operand, lda: int, b: NMMatrix,
                       call_ptrs: dict[str, int], handle: Any) -> None:
        """A plan in chunks of rows. Stream j % 2 of two, the caller's and
        ``second_stream``, runs chunk j's launches, so that chunk j's first launch (A's
        copy) overlaps chunk j-1's others (the main kernel) on the other stream, and chunk j
        reuses the workspaces of chunk j-2. The only wait between the two streams before
        the end is chunk 1's: its first launch follows chunk 0's (and so the caller's work
        before this call), ``chunk_delay_ns`` later on the GPU, so that chunk 0's main
        kernel takes the SMs first. The caller's stream then waits for the second's, so
        work queued on it after this call, and the pool's reuse of the workspaces, come
        after both."""
        cp = cupy()
        caller = handle if handle is not None else cp.cuda.get_current_stream()
        streams = (caller, second_stream(a_op.device))
        chunks = whole.plan.chunks
        plans = {rows: self._bound(b, a_op, rows, lda, caller.ptr) for rows in set(chunks)}
        a_step = lda * a_op.strides[1] if self.config.a_layout is ALayout.ROW_MAJOR \
            else a_op.strides[0]
        c_step = b.shape[1] * self.config.dtype.itemsize
        a_ptr, c_ptr = call_ptrs[data.A], call_ptrs[data.C]
        in_capture = capturing(caller.ptr)
        with caller:  # two sets of workspaces: held until every launch is queued
            spaces = [_workspaces(list(plans.values()), whole, a_op, in_capture, caller.ptr)
                      for _ in range(2)]
        first_done, first = None, 0
        for j, rows in enumerate(chunks):
            stream = streams[j % 2]
            ptrs = {**call_ptrs, data.A: a_ptr + a_step * first,
                    data.C: c_ptr + c_step * first, **_addresses(spaces[j % 2])}
            if j == 1:
                stream.wait_event(first_done)
                wait_kernel()((1,), (1,), (np.uint64(whole.plan.chunk_delay_ns),),
                              stream=stream)
            plans[rows].run(ptrs, stream.ptr, last=1)
            if j == 0:
                first_done = record(stream)
            plans[rows].run(ptrs, stream.ptr, first=1)
            first += rows
        caller.wait_event(record(streams[1]))

    def _kernel_instead(self, config: Config) -> Kernel:
        kernel = self._instead.get(config.name)
        if kernel is None:
            kernel = self._instead[config.name] = Kernel(config)
            kernel.pipeline = self.pipeline
        return kernel

    # -------------------------------------------------------------- checks
    def _bias(self, bias: Any, a_op: Operand, cols: int) -> int:
        """The address of ``bias``, checked against the kernel's epilogue: ``N`` values
        in its dtype, contiguous, on ``a``'s device; 0 where the kernel adds none."""
        if bias is None:
            if self._adds_bias:
                raise ValueError(f"kernel {self.name} adds a bias: pass bias= ({cols} "
                                 f"{self.config.dtype.value} values)")
            return 0
        if not self._adds_bias:
            raise ValueError(f"kernel {self.name} adds no bias; its configuration's "
                             "epilogue must include one (e.g. epilogue='bias')")
        op = operand(bias, "bias")
        key = (op.shape, op.strides, op.dtype, op.device, a_op.device, cols)
        if key not in self._bias_checked:
            check_bias(op, a_op, cols, self.config)
            self._bias_checked.add(key)
        return op.ptr

    def _check_a(self, a_op: Operand, b: NMMatrix) -> tuple[int, int]:
        """``check_a``, remembered for what it depends on but the pointer and the device,
        which are checked on every call."""
        if isinstance(b, NMMatrix):
            key = (a_op.shape, a_op.strides, a_op.dtype, b.n, b.m, b.vec, b.shape[0],
                   b._values.dtype)
            checked = self._a_checked.get(key)
            if checked is not None:
                check_placement(a_op)
                return checked
            checked = self._a_checked[key] = check_a(a_op, b, self.config)
            return checked
        return check_a(a_op, b, self.config)  # raises

    def _output(self, out: Any, a: Any, a_op: Operand, shape: tuple[int, int]
                ) -> tuple[Any, Operand]:
        """(what the caller gets, its operand): ``out`` checked, or a new array of ``a``'s
        kind in the kernel's dtype."""
        dtype = self.config.dtype
        if out is None:
            out = empty_like_caller(a, a_op, shape, dtype)
            return out, operand(out, "out")
        c = operand(out, "out")
        key = (c.shape, c.dtype, c.strides, c.device, a_op.device, shape)
        if key in self._out_checked:
            return out, c
        if tuple(c.shape) != shape:
            raise ValueError(f"out has shape {tuple(c.shape)}; the product is "
                             f"{shape[0]}×{shape[1]}")
        if c.dtype is not dtype:
            raise TypeError(f"out has the wrong dtype; expected {dtype.value}")
        size = dtype.itemsize
        if shape[0] and shape[1] and c.strides != (size * shape[1], size) and shape[0] > 1:
            raise ValueError("out must be C-contiguous (row-major M×N)")
        if c.device != a_op.device:
            raise ValueError(f"out is on GPU {c.device}, a on GPU {a_op.device}")
        self._out_checked.add(key)
        return out, c


def _workspaces(plans: list[BoundPlan], keeper: BoundPlan, a_op: Operand, in_capture: bool,
                stream_ptr: int) -> dict[str, tuple[Any, int]]:
    """The workspaces ``plans`` need, each as large as the largest of them asks: (array,
    address) by name, zero-filled where asked, on the current stream; a persistent one is
    ``keeper``'s for this stream, made at its first call. The caller holds the arrays until
    its launches are queued.

    A graph captured on a stream that already made its persistent workspace (torch's CUDA
    graph trees warm up and record on one stream) uses that one too: the kernels leave it
    zeroed, so the graph holds no zero-fill of its own (a kernel node a launch). Graphs
    that use it must then not replay at the same time as each other or as calls on that
    stream, which torch's graph trees never do."""
    specs: dict[str, Any] = {}
    for bound in plans:
        for space in bound.plan.workspaces:
            held = specs.get(space.name)
            if held is None or held.count < space.count:
                specs[space.name] = space
    spaces = {}
    for name, s in specs.items():
        key = (name, stream_ptr)
        if s.persistent and key in keeper.persistent:
            spaces[name] = keeper.persistent[key]
        elif in_capture and a_op.torch:  # from the graph's pool, as torch's own temporaries
            spaces[name] = _torch_workspace(a_op, s.count, s.dtype, s.zeroed or s.persistent)
        elif s.persistent:  # the stream's first call: made zeroed, then kept so
            array, ptr = _workspace(keeper, a_op, in_capture, s.count, s.dtype, True)
            keeper.kept.append(array)  # held with the plan, never back to a pool
            keeper.persistent[key] = spaces[name] = (array, ptr)
        else:
            spaces[name] = _workspace(keeper, a_op, in_capture, s.count, s.dtype, s.zeroed)
    return spaces


def _addresses(spaces: dict[str, tuple[Any, int]]) -> dict[str, int]:
    return {name: ptr for name, (_, ptr) in spaces.items()}


def _workspace(keeper: BoundPlan, a_op: Operand, in_capture: bool, count: int,
               dtype: np.dtype, zeroed: bool) -> tuple[Any, int]:
    """(array, address) of a workspace of ``count`` elements on the current stream, from
    CuPy's pool, which hands it out again only after the work queued on that stream so
    far. A launch captured into a CUDA graph from CuPy writes its workspace at every
    replay, long after the call, so it is kept on the plan for as long as the weight
    (capture a launch once and replay it)."""
    cp = cupy()
    try:
        array = (cp.zeros if zeroed else cp.empty)(count, dtype)
    except cp.cuda.runtime.CUDARuntimeError as exc:
        if not in_capture:
            raise
        raise RuntimeError(
            "nmgen could not allocate a workspace while a CUDA graph was being captured "
            f"({exc}); make the same call once on this stream before capturing, so that "
            "CuPy's pool holds the memory, or capture in relaxed mode") from exc
    if in_capture:
        keeper.kept.append(array)
    return array, array.data.ptr


def _torch_workspace(a_op: Operand, count: int, dtype: np.dtype, zeroed: bool
                     ) -> tuple[Any, int]:
    """A workspace of a launch that a PyTorch caller captures into a CUDA graph: a
    temporary of the graph's memory pool (``torch.cuda.graph`` and the graph trees of
    ``torch.compile(mode="reduce-overhead")`` alike), which the graph's later work may
    reuse once the launch is done, as with torch's own temporaries. One the kernels keep
    between calls (the split-K tile counters) that the capturing stream has not made
    before is zeroed by the graph at every replay."""
    import torch

    make = torch.zeros if zeroed else torch.empty
    tensor = make(count, dtype=torch.int32 if dtype == np.int32 else torch.float32,
                  device=f"cuda:{a_op.device}")
    return tensor, tensor.data_ptr()


def check_placement(a: Operand) -> None:
    current = current_device()
    if a.device != current:
        raise ValueError(f"a is on GPU {a.device} but the current device is {current}")
    if a.dtype is not None and a.ptr % a.dtype.itemsize:
        raise ValueError(f"a's data pointer is not {a.dtype.itemsize}-byte aligned")


def check_bias(bias: Operand, a: Operand, cols: int, config: Config) -> None:
    """A bias is ``N`` contiguous values of the kernel's dtype on ``a``'s device."""
    dtype = config.dtype
    if tuple(bias.shape) != (cols,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}; the product has {cols} "
                         "columns: pass a vector of that length")
    if bias.dtype is not dtype:
        raise TypeError(f"bias is {bias.dtype_name}: kernel {config.name} takes a "
                        f"{dtype.value} bias")
    if cols > 1 and bias.strides != (dtype.itemsize,):
        raise ValueError(f"bias has strides {bias.strides}: it must be contiguous")
    if bias.device != a.device:
        raise ValueError(f"bias is on GPU {bias.device}, a on GPU {a.device}")


def check_a(a: Operand, b: NMMatrix, config: Config) -> tuple[int, int]:
    """Validate ``a`` (logical ``M×K``) against the weight and the kernel; return
    ``(M, lda)`` with ``lda`` in elements."""
    if not isinstance(b, NMMatrix):
        raise TypeError(f"b must be an nmgen.NMMatrix (see nmgen.prune), got {type(b)}")
    if (b.n, b.m, b.vec) != (config.n, config.m, config.vec):
        raise ValueError(f"kernel {config.name} is for {config.n}:{config.m} L={config.vec}; "
                         f"b is {b.pattern} L={b.vec}")
    dtype = config.dtype
    if a.dtype is not dtype:
        raise TypeError(f"a is {a.dtype_name}: kernel {config.name} takes {dtype.value} "
                        "activations")
    if b.dtype is not dtype:
        raise TypeError(f"b holds {b.dtype.value} values: kernel {config.name} takes "
                        f"{dtype.value} weights")
    if len(a.shape) != 2:
        raise ValueError(f"a must be 2-D (M×K), got shape {a.shape}")
    m_rows, k_dim = a.shape
    if k_dim != b.shape[0]:
        raise ValueError(f"a is {m_rows}×{k_dim} but b is {b.shape[0]}×{b.shape[1]}: "
                         "a's K must equal b's K")
    if max(m_rows, *b.shape) > MAX_DIM:
        raise ValueError(f"a is {m_rows}×{k_dim}, b {b.shape[0]}×{b.shape[1]}: each of M, N "
                         f"and K must be at most {MAX_DIM} (the kernels index in 32 bits)")
    check_placement(a)
    size = dtype.itemsize
    row_major = config.a_layout is ALayout.ROW_MAJOR
    inner, outer = (1, 0) if row_major else (0, 1)
    extent = k_dim if row_major else m_rows
    if m_rows and k_dim and (a.strides[inner] != size or a.strides[outer] < size * extent
                             or a.strides[outer] % size):
        want = ("row-major M×K (C-contiguous, a K stride of 1)" if row_major
                else "K-major: an M×K view whose M stride is 1, e.g. a_kxm.T")
        raise ValueError(f"a has strides {a.strides}; kernel {config.name} needs A {want}")
    return m_rows, (a.strides[outer] // size if m_rows and k_dim else max(extent, 1))


# A one-thread kernel that waits on the GPU's nanosecond timer. The timing queues it before
# each timed call (so that the events bracket the device work alone, not the host's launch
# path); a pipelined call puts it before chunk 1's first launch.
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
def wait_kernel() -> Any:
    return cupy().RawKernel(_WAIT_SOURCE, "nmgen_wait_ns")
