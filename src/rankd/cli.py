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
    restore = commands.add_parser(
        "restore", help="rebuild a data dir from Postgres",
        description="Rebuild a data dir from the events rankd shipped to Postgres (for when "
                    "the local disk is lost).  The data dir must be new or empty.")
    restore.add_argument("--from-postgres", dest="dsn", required=True, metavar="DSN",
                         help="PostgreSQL DSN rankd shipped its events to")
    restore.add_argument("--data-dir", required=True, metavar="DIR",
                         help="data dir to create")
    return parser


def _restore(dsn: str, data_dir: str) -> int:
    import asyncio
    import logging

    from rankd.engine.postgres import restore

    logging.basicConfig(level=logging.INFO, format="%(message)s")

    def progress(done: int, total: int) -> None:
        print(f"restore: {done} of {total} events", file=sys.stderr)

    try:
        last = asyncio.run(restore(dsn, data_dir, progress=progress))
    except (RuntimeError, OSError) as exc:
        print(f"rankd: restore failed: {exc}", file=sys.stderr)
        return 1
    print(f"restored {data_dir} up to event {last}; start it with "
          f"rankd serve --data-dir {data_dir}")
    return 0


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
    elif args.command == "restore":
        return _restore(args.dsn, args.data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
