"""Writing generated kernels to disk for people to read (and, optionally, their cubins)."""

from __future__ import annotations

import inspect
import json
import shutil
from pathlib import Path

from .codegen import render
from .families.base import Config
from .families.registry import config_from_dict, config_from_name, family_of
from .version import __version__


def load_config(spec: str) -> Config:
    """A configuration from its canonical name or from a JSON file."""
    path = Path(spec)
    if spec.endswith(".json") or path.is_file():
        try:
            values = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
        return config_from_dict(values)
    return config_from_name(spec)


def provenance(config: Config) -> str:
    """The comment an exported kernel starts with: where the arrays it reads and its
    launch come from, which the generated source alone does not say."""
    family = family_of(config)
    folder = Path(inspect.getfile(type(family))).resolve().parent
    package = Path(__file__).resolve().parent.parent
    where = folder.relative_to(package) if folder.is_relative_to(package) else folder
    return (f"// Exported by nmgen {__version__} ({family.title} family). The weight's arrays\n"
            f"// this kernel reads are made by the family's prepare() and its launches (grid,\n"
            f"// block, shared memory, arguments, workspaces) by its plan(): {where}/.\n")


def export_kernel(config: Config, out_dir: Path, cubin: bool = False) -> list[Path]:
    """Write ``NAME.cu`` (the generated source behind a provenance comment) and
    ``NAME.json`` (and ``NAME.cubin`` + ptxas log, through nvcc)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    source = render(config)
    written = [out_dir / f"{config.name}.cu", out_dir / f"{config.name}.json"]
    written[0].write_text(provenance(config) + source.code)
    written[1].write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
    if cubin:
        from .compiler.nvcc import compile_with_nvcc

        compiled = compile_with_nvcc(source)
        target = out_dir / f"{config.name}.cubin"
        shutil.copyfile(compiled.path, target)
        log = out_dir / f"{config.name}.ptxas.txt"
        log.write_text(compiled.log)
        written += [target, log]
    return written


def export_from_db(db_url: str | None, shapes: list[tuple[int, int, int]], out_dir: Path,
                   cubin: bool = False, quiet: bool = False) -> Path:
    """Export the tuned winner of every listed shape (all GPUs, families and patterns in
    the database) and write ``index.md`` mapping problems to kernel files. A problem with
    only a dry run's estimates exports the model's choice, marked as not measured."""
    from .policy import summary
    from .progress import Progress
    from .store.database import connect

    out_dir.mkdir(parents=True, exist_ok=True)
    wanted = set(shapes)
    rows = sorted((r for r in summary(connect(db_url, writable=False))
                   if tuple(r["shape"]) in wanted and r["best"] is not None),
                  key=lambda r: (r["gpu"], r["family"], r["pattern"], r["shape"]))
    lines = ["| gpu | family | dtype | pattern | L | A | M | N | K | ms | kernel |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    exported: set[str] = set()
    with Progress(len(rows), "problems", quiet) as bar:
        for row in rows:
            bar.advance()
            if row["best"] not in exported:
                export_kernel(config_from_name(row["best"]), out_dir, cubin=cubin)
                exported.add(row["best"])
            m, n, k = row["shape"]
            ms = (f"{row['time_ms']:.4f}" if row["measured"]
                  else f"model {row['time_ms']:.4f}, not measured")
            lines.append(f"| {row['gpu']} | {row['family']} | {row['dtype']} | {row['pattern']} "
                         f"| {row['vec']} | {row['a_layout']} | {m} | {n} | {k} | {ms} "
                         f"| [{row['best']}.cu]({row['best']}.cu) |")
    index = out_dir / "index.md"
    index.write_text("\n".join(lines) + "\n")
    return index
