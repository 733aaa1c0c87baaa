"""Compiling through NVRTC and launching: the one module that needs CuPy and a GPU.

``Kernel(config)(a, b)`` checks its inputs, prepares the weight's kernel-side layout once
per device (cached on the ``NMMatrix``), and launches on the caller's stream. CuPy arrays
and PyTorch CUDA tensors both work; the output is of the same kind as ``a``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..codegen import render
from ..config import ALayout, KernelConfig
from ..format import NMMatrix
from ..prepare import LayoutKey, prepare_layout

NVRTC_OPTIONS = ("-std=c++17",)
_LOCK = threading.Lock()


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


class Kernel:
    """One compiled configuration: ``Kernel(config)(a, b, out=None, stream=None)``."""

    def __init__(self, config: KernelConfig):
        self.config = config
        self.source = render(config)
        self._functions: dict[int, tuple[Any, Any]] = {}

    @property
    def name(self) -> str:
        return self.config.name

    def _compiled(self) -> tuple[Any, Any]:
        """(main, reduce) functions for the current device, compiled once (CuPy caches
        NVRTC output on disk, keyed by source, options, arch and compiler version)."""
        cp = _cupy()
        device = cp.cuda.Device().id
        with _LOCK:
            if device not in self._functions:
                module = cp.RawModule(code=self.source.code, options=NVRTC_OPTIONS,
                                      backend="nvrtc")
                main = module.get_function(self.name)
                if self.config.smem_bytes > 48 * 1024:
                    main.max_dynamic_shared_size_bytes = self.config.smem_bytes
                reduce = (module.get_function(f"{self.name}_reduce")
                          if self.config.split_k > 1 else None)
                self._functions[device] = (main, reduce)
            return self._functions[device]

    def __call__(self, a: Any, b: NMMatrix, out: Any = None, stream: Any = None) -> Any:
        cp = _cupy()
        torch_in = _is_torch(a)
        a_cp = _as_cupy(a, "a")
        m_rows = _check_a(a_cp, b, self.config)
        k_dim, n_cols = b.shape
        out_user, out_cp = _output(out, a, a_cp, (m_rows, n_cols), torch_in)
        if m_rows == 0:
            return out_user
        main, reduce = self._compiled()
        layout = device_layout(b, self.config)
        lda = a_cp.strides[0 if self.config.a_layout is ALayout.ROW_MAJOR else 1] // 4
        # 16-byte copies along A's contiguous dimension need it and the rows aligned.
        contiguous_extent = k_dim if self.config.a_layout is ALayout.ROW_MAJOR else m_rows
        a_vec4 = contiguous_extent % 4 == 0 and lda % 4 == 0 and a_cp.data.ptr % 16 == 0
        c = self.config
        stages_total = layout.pos.shape[1]
        per_split = -(-stages_total // c.split_k)
        grid = (layout.values.shape[1] // c.ns, -(-m_rows // c.ms), c.split_k)
        with _stream(stream, a, torch_in):
            target = out_cp
            if c.split_k > 1:
                target = cp.empty((c.split_k, m_rows, n_cols), np.float32)
            c_vec4 = n_cols % 4 == 0 and target.data.ptr % 16 == 0
            main(grid, (c.threads,), (
                a_cp, layout.values, layout.pos, layout.rows, target,
                np.int32(m_rows), np.int32(n_cols), np.int32(k_dim),
                np.int64(lda), np.int64(layout.values.shape[1]), np.int64(n_cols),
                np.int32(stages_total), np.int32(per_split), np.int32(a_vec4),
                np.int32(c_vec4),
            ), shared_mem=c.smem_bytes)
            if reduce is not None:
                blocks = min(-(-m_rows * n_cols // 256), 132 * 16)
                reduce((blocks,), (256,), (target, out_cp, np.int32(m_rows),
                                            np.int32(n_cols), np.int64(n_cols)))
        return out_user


def _as_cupy(x: Any, what: str) -> Any:
    cp = _cupy()
    if isinstance(x, cp.ndarray):
        return x
    if _is_torch(x):
        if not x.is_cuda:
            raise ValueError(f"{what} is a CPU tensor: move it to the GPU (tensor.cuda())")
        return cp.asarray(x.detach())
    if isinstance(x, np.ndarray):
        raise TypeError(f"{what} is a NumPy array: pass a CuPy array or a CUDA torch.Tensor")
    raise TypeError(f"{what}: expected a CuPy array or a CUDA torch.Tensor, got {type(x)}")


def _check_a(a: Any, b: NMMatrix, config: KernelConfig) -> int:
    """Validate ``a`` (logical ``M×K``) against the weight and the kernel; return ``M``."""
    cp = _cupy()
    if not isinstance(b, NMMatrix):
        raise TypeError(f"b must be an nmgen.NMMatrix (see nmgen.prune), got {type(b)}")
    if (b.n, b.m, b.vec) != (config.n, config.m, config.vec):
        raise ValueError(f"kernel {config.name} is for {config.n}:{config.m} L={config.vec}; "
                         f"b is {b.pattern} L={b.vec}")
    if a.dtype != np.float32:
        raise TypeError(f"a has dtype {a.dtype}; this kernel family takes float32")
    if a.ndim != 2:
        raise ValueError(f"a must be 2-D (M×K), got shape {a.shape}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a is {a.shape[0]}×{a.shape[1]} but b is {b.shape[0]}×{b.shape[1]}: "
                         "a's K must equal b's K")
    if a.device.id != cp.cuda.Device().id:
        raise ValueError(f"a is on GPU {a.device.id} but the current device is "
                         f"{cp.cuda.Device().id}")
    if a.data.ptr % 4:
        raise ValueError("a's data pointer is not 4-byte aligned")
    m_rows, k_dim = a.shape
    inner, outer = (1, 0) if config.a_layout is ALayout.ROW_MAJOR else (0, 1)
    extent = k_dim if config.a_layout is ALayout.ROW_MAJOR else m_rows
    if m_rows and k_dim and (a.strides[inner] != 4 or a.strides[outer] < 4 * extent
                             or a.strides[outer] % 4):
        want = ("row-major M×K (C-contiguous, a K stride of 1)"
                if config.a_layout is ALayout.ROW_MAJOR
                else "K-major: an M×K view whose M stride is 1, e.g. a_kxm.T")
        raise ValueError(f"a has strides {a.strides}; kernel {config.name} needs A {want}")
    return m_rows


def _output(out: Any, a: Any, a_cp: Any, shape: tuple[int, int], torch_in: bool
            ) -> tuple[Any, Any]:
    """(what the caller gets, the CuPy view the kernel writes)."""
    cp = _cupy()
    if out is None:
        if torch_in:
            import torch

            out = torch.empty(shape, dtype=torch.float32, device=a.device)
        else:
            out = cp.empty(shape, np.float32)
    out_cp = _as_cupy(out, "out")
    if out_cp.shape != shape:
        raise ValueError(f"out has shape {out_cp.shape}; the product is {shape[0]}×{shape[1]}")
    if out_cp.dtype != np.float32:
        raise TypeError(f"out has dtype {out_cp.dtype}; expected float32")
    if not out_cp.flags.c_contiguous:
        raise ValueError("out must be C-contiguous (row-major M×N)")
    if out_cp.device.id != a_cp.device.id:
        raise ValueError(f"out is on GPU {out_cp.device.id}, a on GPU {a_cp.device.id}")
    return out, out_cp


def _stream(stream: Any, a: Any, torch_in: bool) -> Any:
    """A CuPy stream context for ``stream`` (CuPy, torch or a raw handle), defaulting to
    the caller's current stream (torch's for torch tensors)."""
    cp = _cupy()
    if stream is None and torch_in:
        import torch

        stream = torch.cuda.current_stream(a.device)
    if stream is None:
        return cp.cuda.get_current_stream()
    if isinstance(stream, cp.cuda.Stream | cp.cuda.ExternalStream):
        return stream
    handle = getattr(stream, "cuda_stream", stream)  # torch.cuda.Stream or an int
    return cp.cuda.ExternalStream(int(handle))
