"""Writing generated kernels to disk for people to read (and, optionally, their cubins)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .codegen import render
from .families.base import Config
from .families.registry import config_from_dict, config_from_name


def load_config(spec: str) -> Config:
    """A configuration from its canonical name or from a JSON file."""
    path = Path(spec)
    if spec.endswith(".json") or path.is_file():
        return config_from_dict(json.loads(path.read_text()))
    return config_from_name(spec)


def export_kernel(config: Config, out_dir: Path, cubin: bool = False) -> list[Path]:
    """Write ``NAME.cu`` and ``NAME.json`` (and ``NAME.cubin`` + ptxas log, through nvcc)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    source = render(config)
    written = [out_dir / f"{config.name}.cu", out_dir / f"{config.name}.json"]
    written[0].write_text(source.code)
    written[1].write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
    if cubin:
        from .build.nvcc import compile_with_nvcc

        compiled = compile_with_nvcc(source)
        target = out_dir / f"{config.name}.cubin"
        shutil.copyfile(compiled.path, target)
        log = out_dir / f"{config.name}.ptxas.txt"
        log.write_text(compiled.log)
        written += [target, log]
    return written


def export_from_db(db_url: str | None, shapes: list[tuple[int, int, int]], out_dir: Path,
                   cubin: bool = False) -> Path:
    """Export the tuned winner of every listed shape (all GPUs and patterns in the
    database) and write ``index.md`` mapping problems to kernel files."""
    from .policy import summary
    from .store.database import connect

    out_dir.mkdir(parents=True, exist_ok=True)
    wanted = set(shapes)
    lines = ["| gpu | pattern | L | A | M | N | K | ms | kernel |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    exported: set[str] = set()
    for row in sorted(summary(connect(db_url)), key=lambda r: (r["gpu"], r["pattern"],
                                                                 r["shape"])):
        if tuple(row["shape"]) not in wanted or row["best"] is None:
            continue
        if row["best"] not in exported:
            export_kernel(config_from_name(row["best"]), out_dir, cubin=cubin)
            exported.add(row["best"])
        m, n, k = row["shape"]
        lines.append(f"| {row['gpu']} | {row['pattern']} | {row['vec']} | {row['a_layout']} "
                     f"| {m} | {n} | {k} | {row['time_ms']:.4f} | [{row['best']}.cu]"
                     f"({row['best']}.cu) |")
    index = out_dir / "index.md"
    index.write_text("\n".join(lines) + "\n")
    return index
