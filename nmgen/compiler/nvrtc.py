"""Compiling through NVRTC into CuPy's on-disk kernel cache, and the one import of CuPy.

The runtime loads compiled kernels from that cache (``nmgen.runtime.launch``); the
compile processes of ``nmgen.compiler.pool`` fill it ahead of timing without making a CUDA
context of their own. ``cupy()`` is the only place nmgen imports CuPy.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from ..codegen import render
from ..families.registry import config_from_dict

NVRTC_OPTIONS = ("-std=c++17",)


@functools.cache  # on every launch: a cached call costs less than the import statement
def cupy() -> Any:
    try:
        import cupy as module
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise RuntimeError(
            "running kernels needs CuPy for your CUDA version: pip install cupy-cuda13x "
            "(or cupy-cuda12x), or nmgen's extra: pip install 'nmgen[cuda13]'") from exc
    return module


def compile_module(code: str, target: str | None = None) -> Any:
    """A CuPy ``RawModule`` of ``code``: compiled at first use for the device's arch,
    through CuPy's cache; for an arch-specific ``target`` from ``build_cubin``'s cubin."""
    if arch_specific(target):
        return cupy().RawModule(path=str(build_cubin(code, target)))
    return cupy().RawModule(code=code, options=NVRTC_OPTIONS, backend="nvrtc")


def arch_specific(target: str | None) -> bool:
    """Whether ``target`` is an arch-specific one (``sm_90a``: wgmma, setmaxnreg), which
    CuPy's compile cannot ask for."""
    return target is not None and target[-1].isalpha()


# What CuPy's NVRTC compiles add beside NVRTC_OPTIONS (denormal FP32 results flushed)
ARCH_SPECIFIC_OPTIONS = (*NVRTC_OPTIONS, "-ftz=true")


def build_cubin(code: str, target: str) -> Path:
    """The cubin of ``code`` for ``target``, compiled by NVRTC and kept beside CuPy's
    kernels, keyed by source, options and NVRTC version (written to a temporary file and
    renamed into place)."""
    cupy()  # CuPy present, or its install message
    from cupy_backends.cuda.libs import nvrtc

    options = [*ARCH_SPECIFIC_OPTIONS, f"-arch={target}"]
    key = hashlib.sha256("\0".join([code, *options, repr(nvrtc.getVersion())]).encode())
    folder = kernel_cache_dir() / "nmgen-cubins"
    path = folder / f"{key.hexdigest()[:32]}.cubin"
    if path.exists():
        return path
    program = nvrtc.createProgram(code, "kernel.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"NVRTC failed for {target}:\n"
                               f"{nvrtc.getProgramLog(program)}") from exc
        cubin = nvrtc.getCUBIN(program)
    finally:
        nvrtc.destroyProgram(program)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    with os.fdopen(fd, "wb") as handle:
        handle.write(cubin)
    os.replace(tmp, path)
    return path


def kernel_cache_dir() -> Path:
    """CuPy's on-disk kernel cache (``CUPY_CACHE_DIR``, else its default)."""
    return Path(os.environ.get("CUPY_CACHE_DIR") or Path.home() / ".cupy" / "kernel_cache")


_lock_wait_s = 0.0  # this process's time waiting in ``host_lock``, summed


def lock_wait_seconds() -> float:
    """This process's time waiting in ``host_lock`` so far."""
    return _lock_wait_s


@contextlib.contextmanager
def host_lock(name: str, folder: Path | None = None):
    """Only one process of this host at a time holds ``name``'s lock. Around a kernel's
    compile, the workers of one host (``--devices``), which share CuPy's cache, compile
    each kernel once: the others wait, then find it in the cache (both compiled the seeds
    every study starts with, docs/engineering-notes.md §9-10)."""
    global _lock_wait_s
    folder = folder or kernel_cache_dir() / "nmgen-locks"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.lock", "a") as handle:
        start = time.perf_counter()
        fcntl.flock(handle, fcntl.LOCK_EX)
        _lock_wait_s += time.perf_counter() - start
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def compile_one(config_json: str) -> str | None:
    """Worker: compile through NVRTC so that CuPy's on-disk cache holds the result (in a
    compile process, only there: ``_cache_only``)."""
    import json

    config = config_from_dict(json.loads(config_json))
    try:
        with host_lock(config.name):
            source = render(config)
            if arch_specific(source.target):
                build_cubin(source.code, source.target)
            else:
                compile_module(source.code).compile()
    except Exception as exc:  # reported, not raised: one bad kernel must not stop a batch
        return f"{config.name}: {exc}"
    return None


def compile_arch() -> str | None:
    """The target CuPy compiles for on this process's GPU (as its cache key has it), or
    ``None`` where CuPy or a GPU is missing (the CPU tests)."""
    try:
        from cupy.cuda import compiler

        return compiler._get_arch()
    except Exception:  # no CuPy, no driver, no GPU: compile processes load as before
        return None


def _cache_only(arch: str) -> bool:
    """Compile process: compile for ``arch`` into CuPy's on-disk cache, and stop there.

    CuPy's compile-and-cache step asks the GPU for its compute capability and ends by
    loading the module; both make a CUDA context of this process on the GPU the tuning
    worker times kernels on (contexts of separate processes share a GPU by time slices),
    and cost its start-up the context. The process launches nothing, so the target comes
    from the worker and the load is skipped; the worker then loads the cubin from the
    cache under the same key. Returns whether CuPy's compiler was as expected (if not,
    nothing changes: compiling makes a context as before)."""
    try:
        from cupy.cuda import compiler, function
    except ImportError:
        return False
    if not all(hasattr(compiler, a) for a in ("_get_arch", "function", "_compile_with_cache_cuda")):
        return False

    class CacheOnlyModule(function.Module):
        def load(self, cubin: bytes) -> None:  # kept in the disk cache, not on the GPU
            pass

    compiler._get_arch = lambda: arch
    compiler.function = types.SimpleNamespace(Module=CacheOnlyModule,
                                              LinkState=function.LinkState)
    return True


@functools.cache
def cache_only(arch: str) -> bool:
    """``_cache_only`` once a process: each kernel's job brings the target (``pool``),
    as the processes start before the worker has asked its GPU for it."""
    return _cache_only(arch)


def start_compile_process(niceness: int) -> None:
    """Initializer of a compile process: a lower CPU priority where asked (``AHEAD_NICE``)."""
    if niceness:
        os.nice(niceness)


def has_cuda_context() -> bool:
    """Whether this process has made a CUDA context current (the GPU tests' check that the
    compile processes make none)."""
    driver = cupy().cuda.driver
    try:
        return driver.ctxGetCurrent() != 0
    except driver.CUDADriverError:  # the driver not even initialized: no context
        return False


_WARM_SOURCE = 'extern "C" __global__ void nmgen_warm() {}'


def warm() -> None:
    """Worker: pay a process's one-time costs now, beside the tuner's own set-up, instead of
    in its first kernel: loading CuPy, its compiler and NVRTC, and NVRTC's first compile
    (on an H100, the first compile of 16 fresh processes took ~2 s longer than the next:
    docs/engineering-notes.md §9-10). NVRTC compiles for its default target: the GPU's is
    not known yet, and asking CuPy would make a CUDA context here (``_cache_only``)."""
    try:
        cupy()
        from cupy.cuda import compiler  # noqa: F401  (CuPy's compile-and-cache step)
        from cupy_backends.cuda.libs import nvrtc
    except (RuntimeError, ImportError):  # no CuPy: the CPU tests' fake compilers need none
        return
    program = nvrtc.createProgram(_WARM_SOURCE, "warm.cu", (), ())
    try:
        nvrtc.compileProgram(program, NVRTC_OPTIONS)
    except nvrtc.NVRTCError:  # only a cold first kernel: nothing else depends on it
        pass
    finally:
        nvrtc.destroyProgram(program)
