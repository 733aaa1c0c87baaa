"""Writing generated kernels to disk for people to read (and, optionally, their cubins)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .codegen import render
from .config import KernelConfig


def load_config(spec: str) -> KernelConfig:
    """A configuration from its canonical name or from a JSON file."""
    path = Path(spec)
    if spec.endswith(".json") or path.is_file():
        return KernelConfig.from_json(path.read_text())
    return KernelConfig.from_name(spec)


def export_kernel(config: KernelConfig, out_dir: Path, cubin: bool = False) -> list[Path]:
    """Write ``NAME.cu`` and ``NAME.json`` (and ``NAME.cubin`` + ptxas log, through nvcc)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    source = render(config)
    written = [out_dir / f"{config.name}.cu", out_dir / f"{config.name}.json"]
    written[0].write_text(source.code)
    written[1].write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
    if cubin:
        from .compile import compile_with_nvcc

        compiled = compile_with_nvcc(source)
        target = out_dir / f"{config.name}.cubin"
        shutil.copyfile(compiled.path, target)
        log = out_dir / f"{config.name}.ptxas.txt"
        log.write_text(compiled.log)
        written += [target, log]
    return written
