"""Compiling generated source with ``nvcc`` (no GPU needed): cubin/PTX and the ptxas report.

Launching compiles through NVRTC in CuPy (``nmgen.compiler.nvrtc``); this module serves export,
dry runs and the CPU tests, which must work where no GPU driver is present. Results are
cached on disk, keyed by the source, the target, the options and the nvcc version.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..cache import cache_root
from ..codegen import KernelSource

NVCC_OPTIONS = ("-std=c++17", "-O3")


class CompileError(RuntimeError):
    """nvcc rejected generated source; the message carries its log."""


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one entry point."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    static_smem: int


@dataclass(frozen=True)
class CompiledKernel:
    path: Path  # the cubin or PTX file (in the cache)
    resources: dict[str, Resources]  # per entry point
    log: str  # nvcc's output (the -Xptxas -v report)


def cache_dir() -> Path:
    path = cache_root() / "nvcc"
    path.mkdir(parents=True, exist_ok=True)
    return path


def nvcc_path() -> str | None:
    return shutil.which("nvcc")


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str:
    nvcc = nvcc_path()
    if nvcc is None:
        raise CompileError("nvcc not found on PATH (install the CUDA toolkit)")
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def compile_with_nvcc(source: KernelSource, output: str = "cubin",
                      arch: str | None = None) -> CompiledKernel:
    """Compile ``source`` for its target (``KernelSource.target``, or ``arch``) to a cubin
    or PTX."""
    if output not in ("cubin", "ptx"):
        raise ValueError(f"output {output!r}: expected 'cubin' or 'ptx'")
    target = (arch or source.target).replace("sm_", "")
    options = [*NVCC_OPTIONS, f"-arch=sm_{target}", "-Xptxas", "-v", f"-{output}"]
    key = hashlib.sha256(
        "\0".join([source.code, " ".join(options), nvcc_version()]).encode()
    ).hexdigest()[:32]
    base = cache_dir() / f"{source.name}-{key}"
    artifact, log_file = base.with_suffix(f".{output}"), base.with_suffix(".log")
    if artifact.exists() and log_file.exists():
        log = log_file.read_text()
        return CompiledKernel(artifact, parse_ptxas_report(log), log)
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / f"{source.name}.cu"
        cu.write_text(source.code)
        out = Path(tmp) / f"out.{output}"
        proc = subprocess.run([nvcc_path() or "nvcc", *options, "-o", str(out), str(cu)],
                              capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise CompileError(f"nvcc failed for {source.name}:\n{log}")
        _write_atomic(log_file, log.encode())
        _write_atomic(artifact, out.read_bytes())
    return CompiledKernel(artifact, parse_ptxas_report(log), log)


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas_report(log: str) -> dict[str, Resources]:
    """Per entry point: registers, spills, stack and static shared memory (``-Xptxas -v``)."""
    result: dict[str, Resources] = {}
    parts = _ENTRY.split(log)
    for name, body in zip(parts[1::2], parts[2::2], strict=False):
        props, used, smem = _PROPS.search(body), _USED.search(body), _SMEM.search(body)
        if not (props and used):
            continue
        result[name] = Resources(
            registers=int(used.group(1)),
            stack_bytes=int(props.group(1)),
            spill_stores=int(props.group(2)),
            spill_loads=int(props.group(3)),
            static_smem=int(smem.group(1)) if smem else 0,
        )
    return result
