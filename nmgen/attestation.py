"""The GPU-test record: which kernel-side sources the GPU tests last passed on.

CI has no GPU. The GPU test run writes ``tests/gpu_attestation.json`` with a hash of the
kernel-side sources; a CPU test fails when the sources no longer match it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "gpu_attestation.json"
# Modules that cannot change what runs on the GPU (host-side tooling only).
HOST_ONLY = frozenset({
    "nmgen/cli.py", "nmgen/export.py", "nmgen/attestation.py", "nmgen/progress.py",
    "nmgen/families/space.py", "nmgen/families/f32_simt/space.py",
    "nmgen/bench/report.py", "nmgen/bench/results.py", "nmgen/bench/plots.py",
    "nmgen/tune/studies.py", "nmgen/tune/storage.py", "nmgen/tune/liveness.py",
    "nmgen/tune/replay.py", "nmgen/tune/workers.py",
    "nmgen/tune/refine.py", "nmgen/tune/command.py", "nmgen/tune/maintain.py",
})


def kernel_side_files(root: Path = ROOT) -> list[Path]:
    """Every family's templates and every package module that can change a kernel or its
    launch."""
    files = sorted(root.glob("nmgen/**/*.j2")) + sorted(root.glob("nmgen/**/*.py"))
    return [f for f in files if f.relative_to(root).as_posix() not in HOST_ONLY]


def source_hash(root: Path = ROOT) -> str:
    digest = hashlib.sha256()
    for path in kernel_side_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes().replace(b"\r\n", b"\n") + b"\0")
    return digest.hexdigest()
