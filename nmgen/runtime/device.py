"""The device, the caller's arrays and streams: CuPy arrays and CUDA PyTorch tensors read
without copies, and the stream a launch goes on (the caller's current one)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..compiler.nvrtc import cupy
from ..format import DType
from ..gpus import Arch, arch_of_capability, gpu_spec


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


def table_device(gpu: str) -> DeviceInfo:
    """A stand-in for the device of GPU table entry ``gpu`` (planning without a GPU;
    records of any CUDA runtime then count as another runtime's)."""
    spec = gpu_spec(gpu)
    return DeviceInfo(f"NVIDIA {spec.name.upper()}", spec.sms, spec.arch.number // 10,
                      spec.arch.number % 10, 0)


_DEVICE_INFO: dict[int, DeviceInfo] = {}


def device_count() -> int:
    """How many CUDA GPUs this process sees (0 without CuPy or a driver)."""
    try:
        return cupy().cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device: all mean "none here"
        return 0


def driver_present() -> bool:
    """Whether the CUDA driver library loads (without initialising CUDA: safe before a
    fork). Elsewhere than Linux and Windows, assumed present."""
    import ctypes
    import sys

    name = {"linux": "libcuda.so.1", "win32": "nvcuda.dll"}.get(sys.platform)
    if name is None:
        return True
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


def device_info() -> DeviceInfo:
    """The current device, queried once per device."""
    cp = cupy()
    try:
        device = cp.cuda.Device().id
    except cp.cuda.runtime.CUDARuntimeError as exc:
        raise RuntimeError(f"no usable CUDA GPU ({exc}): running kernels needs an NVIDIA GPU "
                           "and its driver; tuning with --dry-run, export and the tests' "
                           "CPU part need neither") from None
    info = _DEVICE_INFO.get(device)
    if info is None:
        props = cp.cuda.runtime.getDeviceProperties(device)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        info = DeviceInfo(name, props["multiProcessorCount"], props["major"], props["minor"],
                          cp.cuda.runtime.runtimeGetVersion())
        _DEVICE_INFO[device] = info
    return info


def current_device() -> int:
    return cupy().cuda.runtime.getDevice()


# ------------------------------------------------------------------------ operands
class Operand(NamedTuple):
    """What a launch needs of an array: pointer, shape, byte strides, device, dtype."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    device: int
    dtype: DType | None  # None: a dtype no family takes (dtype_name says which)
    torch: bool
    dtype_name: str


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "is_cuda")


def operand(x: Any, what: str) -> Operand:
    """Read an operand from a CuPy array or a CUDA PyTorch tensor (no copies)."""
    cp = cupy()
    if isinstance(x, cp.ndarray):
        return Operand(x.data.ptr, x.shape, x.strides, x.device.id, DType.of(x), False,
                       str(x.dtype))
    if is_torch(x):
        if not x.is_cuda:
            raise ValueError(f"{what} is a CPU tensor: move it to the GPU (tensor.cuda())")
        size = x.element_size()
        return Operand(x.data_ptr(), tuple(x.shape), tuple(st * size for st in x.stride()),
                       x.get_device(), DType.of(x), True, str(x.dtype).removeprefix("torch."))
    if isinstance(x, np.ndarray):
        raise TypeError(f"{what} is a NumPy array: pass a CuPy array or a CUDA torch.Tensor")
    raise TypeError(f"{what}: expected a CuPy array or a CUDA torch.Tensor, got {type(x)}")


def empty_like_caller(a: Any, a_op: Operand, shape: tuple[int, int], dtype: DType) -> Any:
    """A new array of ``a``'s kind (torch or CuPy) on ``a``'s device."""
    if a_op.torch:
        import torch

        torch_dtype = {DType.F32: torch.float32, DType.BF16: torch.bfloat16,
                       DType.F16: torch.float16}[dtype]
        return torch.empty(shape, dtype=torch_dtype, device=a.device)
    if dtype is DType.BF16:
        raise TypeError("CuPy has no bfloat16 arrays: pass torch tensors for bf16")
    return cupy().empty(shape, dtype.numpy)


def upload(array: np.ndarray) -> Any:
    """A host array on the current device (dtypes CuPy lacks, e.g. bfloat16, as their
    bits)."""
    if array.dtype.kind == "V" or array.dtype.name == "bfloat16":
        array = array.view(f"u{array.dtype.itemsize}")
    return cupy().asarray(array)


# ------------------------------------------------------------------------ streams
def current_stream_ptr() -> int:
    stream_module = cupy().cuda.stream
    if hasattr(stream_module, "get_current_stream_ptr"):
        return stream_module.get_current_stream_ptr()
    return cupy().cuda.get_current_stream().ptr


@functools.cache  # looked up once, not on every launch
def _torch_stream_handle_of() -> Callable[[int], int]:
    """``device -> raw handle of PyTorch's current stream there``: torch's private accessor
    where it exists, as Triton's launcher does (building a ``torch.cuda.Stream`` costs
    microseconds a call)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw or (lambda device: torch.cuda.current_stream(device).cuda_stream)


def launch_stream(stream: Any, a: Operand) -> Any:
    """The CuPy stream to launch on: ``stream`` (CuPy, torch or a raw handle), else the
    caller's current stream (torch's for torch tensors; ``None`` means CuPy's current)."""
    if stream is None:
        if not a.torch:
            return None
        return _external_stream(_torch_stream_handle_of()(a.device))
    cp = cupy()
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


_STREAMS: dict[int, Any] = {}


def _external_stream(handle: int) -> Any:
    """A CuPy stream object for a raw handle, made once a handle."""
    cached = _STREAMS.get(handle)
    if cached is None:
        stream_class = cupy().cuda.Stream
        if hasattr(stream_class, "from_external"):
            cached = stream_class.from_external(_RawStream(handle))
        else:  # pragma: no cover - CuPy before 14
            cached = cupy().cuda.ExternalStream(handle)
        _STREAMS[handle] = cached
    return cached


_SECOND_STREAMS: dict[int, Any] = {}


def second_stream(device: int) -> Any:
    """The second stream of ``device``'s pipelined calls (the caller's is the first), made
    once: non-blocking, of the least priority, as a caller's stream usually is. Two
    streams of the greatest priority beside the caller's were 0.2-0.4 % slower at 4096^3
    on the H100 (docs/engineering-notes.md, "Row-major A")."""
    cached = _SECOND_STREAMS.get(device)
    if cached is None:
        cp = cupy()
        with cp.cuda.Device(device):
            cached = cp.cuda.Stream(non_blocking=True, priority=_priority_range()[0])
        _SECOND_STREAMS[device] = cached
    return cached


def _priority_range() -> tuple[int, int]:
    """(least, greatest) stream priority of the current device; where CuPy does not ask
    the runtime, CUDA's usual range (the driver clamps a value outside its own)."""
    runtime = cupy().cuda.runtime
    if hasattr(runtime, "deviceGetStreamPriorityRange"):
        return runtime.deviceGetStreamPriorityRange()
    return 0, -5  # pragma: no cover - depends on the CuPy version


def record(stream: Any) -> Any:
    event = cupy().cuda.Event(disable_timing=True)
    event.record(stream)
    return event


@functools.cache  # looked up once, not on every launch
def _capture_status() -> Callable[[int], int]:
    """``stream -> cudaStreamIsCapturing`` status (0: not capturing); always 0 where CuPy
    does not offer the call."""
    return getattr(cupy().cuda.runtime, "streamIsCapturing", lambda stream: 0)


def capturing(stream_ptr: int) -> bool:
    """Whether work queued on the stream goes into a CUDA graph being captured."""
    return _capture_status()(stream_ptr) != 0
