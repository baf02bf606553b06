"""The ``tinytf`` command line. Each course tool adds a subcommand here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _info(args: argparse.Namespace) -> int:
    import platform

    import torch

    import tinytf

    dev = tinytf.pick_device(args.device)
    print(f"tinytf {tinytf.__version__} | torch {torch.__version__} | Python {platform.python_version()}")
    print(f"device: {dev} — {tinytf.describe_device(dev)}")
    print(f"CUDA available: {torch.cuda.is_available()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    import tinytf

    parser = argparse.ArgumentParser(prog="tinytf", description="tinytf attention workbook: course tools")
    parser.add_argument("--version", action="version", version=f"tinytf {tinytf.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("info", help="versions and the device the notebooks will use")
    p.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:N or mps (default: $TINYTF_DEVICE or auto)")
    p.set_defaults(func=_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
