"""The ``rankd`` command."""

from __future__ import annotations

import argparse
import sys

from rankd import __version__, config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rankd", description="rankd: a durable, real-time ranking server.")
    parser.add_argument("--version", action="version", version=f"rankd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve", help="run the daemon",
        description="Run the rankd daemon.  Settings come from flags, else RANKD_* "
                    "environment variables, else the --config TOML file, else defaults; "
                    "with none at all it serves on 127.0.0.1 with data in ./rankd-data.")
    config.add_arguments(serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        try:
            settings = config.resolve(args)
        except config.ConfigError as exc:
            print(f"rankd: {exc}", file=sys.stderr)
            return 2
        from rankd.server import run

        try:
            run(settings)
        except RuntimeError as exc:  # e.g. the data dir is locked by another daemon
            print(f"rankd: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
