"""`dynfuse` console command: one subcommand per job, registered by each package.

Each listed module exposes `register(subparsers)`, adding parsers whose
defaults carry `run=callable(args) -> int`. User mistakes arrive here as
DynfuseError (or OSError for paths) and leave as one message and a non-zero
exit code, never a traceback; warnings are one `warning:` line each.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from isa.errors import DynfuseError

SUBCOMMAND_MODULES = (
    "assembler.cli",
    "simulator.cli",
    "fusion.cli",
    "fusion.lower.cli",
    "fusion.engine.cli",
    "fusion.hpm.cli",
    "fusion.explore.cli",
    "rtl.cli",
)

EXIT_USER_ERROR = 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynfuse",
        description="An ML accelerator with an operator-fusion ISA: assemble, simulate, co-simulate with RTL, "
        "compile ONNX models and fuse them dynamically.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():  # (restores the hook on the way out)
            warnings.showwarning = _one_line_warning
            return int(args.run(args) or 0)
    except DynfuseError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as err:
        print(f"error: {err.strerror or err}: {err.filename or ''}".rstrip(": "), file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _one_line_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: object = None,
    line: object = None,
) -> None:
    """A warning to a command-line user is one line (e.g. a kernel cache that fell back to memory)."""
    print(f"warning: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
