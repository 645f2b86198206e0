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
    keygen = commands.add_parser(
        "keygen", help="make a new API key",
        description="Print a new API key (give it to the game server) and the entry to add "
                    "to --api-keys (the server keeps only its hash).")
    keygen.add_argument("key_id", help="a name for the key (letters and digits)")
    keygen.add_argument("--scopes", default="write", help="e.g. write, read+write, admin")
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
        except config.ConfigError as exc:
            print(f"rankd: {exc}", file=sys.stderr)
            return 2
        except RuntimeError as exc:  # e.g. the data dir is locked by another daemon
            print(f"rankd: {exc}", file=sys.stderr)
            return 1
    elif args.command == "keygen":
        from rankd.security.auth import new_api_key

        try:
            key, entry = new_api_key(args.key_id, args.scopes)
        except ValueError as exc:
            print(f"rankd: {exc}", file=sys.stderr)
            return 2
        print(f"API key (secret, shown once):  {key}")
        print(f"server entry for --api-keys:    {entry}")
    elif args.command == "restore":
        return _restore(args.dsn, args.data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
