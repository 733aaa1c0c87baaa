"""The ``nmgen`` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import ConfigError


def _export(args: argparse.Namespace) -> int:
    from .export import export_kernel, load_config

    for spec in args.config:
        for path in export_kernel(load_config(spec), args.out, cubin=args.cubin):
            print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nmgen", description="N:M sparse GEMM kernel "
                                     "compiler and autotuner")
    sub = parser.add_subparsers(dest="command", required=True)
    export = sub.add_parser("export", help="write generated .cu files for inspection")
    export.add_argument("--config", action="append", required=True,
                        help="kernel name or configuration JSON file (repeatable)")
    export.add_argument("--out", type=Path, required=True, help="output directory")
    export.add_argument("--cubin", action="store_true",
                        help="also compile with nvcc: .cubin and the ptxas resource report")
    export.set_defaults(run=_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        print(f"nmgen {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
