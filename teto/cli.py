"""The ``teto`` command: the local stack (``up``), single parts (``service``, ``executor``), and the operator
commands that talk to the gateway (``submit``, ``jobs``, ...; see teto/cli_client.py)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="teto", description="Teto: GPU fine-tuning jobs under GPU-time ceilings")
    sub = parser.add_subparsers(dest="command", required=True)
    from teto import cli_bench, cli_bus, cli_client, cli_stack

    cli_stack.register(sub)
    cli_client.register(sub)
    cli_bus.register(sub)
    cli_bench.register(sub)
    from teto.slurm import cli as cli_slurm

    cli_slurm.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from libs.runtime.settings import SettingsError

    try:
        return int(args.func(args) or 0)
    except SettingsError as exc:
        # A configuration that cannot be safe is refused with its reason, not a traceback.
        print(f"teto {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
