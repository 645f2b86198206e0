"""The ``rankd`` command."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

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
    wal = commands.add_parser("wal", help="inspect the write-ahead log")
    wal_commands = wal.add_subparsers(dest="wal_command", required=True, metavar="ACTION")
    inspect = wal_commands.add_parser(
        "inspect", help="segments, records, positions and checksum status (read-only)")
    inspect.add_argument("data_dir", type=Path, metavar="DATA_DIR")

    def remote(name: str, help_text: str) -> argparse.ArgumentParser:
        command = commands.add_parser(name, help=help_text, description=help_text)
        connection_options(command, admin_default_url(), None)
        return command

    remote("snapshot", "ask a running daemon to write a snapshot now")
    for name, help_text in (("export", "write a board's standings as CSV or JSONL"),
                            ("top", "show a board's leaderboard in the terminal")):
        command = remote(name, help_text)
        command.add_argument("board")
        command.add_argument("--window")
        command.add_argument("--period")
        if name == "export":
            command.add_argument("--format", choices=("csv", "jsonl"), default="csv")
            command.add_argument("--output", type=Path, help="file (default: stdout)")
        else:
            command.add_argument("--limit", type=int, default=10)
    cluster = remote("cluster", "a cluster's state, and records a deposed node set aside")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True,
                                              metavar="ACTION")
    # --url and --token also after the action (`rankd cluster status --url
    # URL`); given there, they win over the same options before it.
    status = cluster_commands.add_parser("status", help="nodes, groups, primaries, epochs "
                                                        "and lag")
    resubmit = cluster_commands.add_parser(
        "resubmit", help="submit a node's wal/orphan-* records again, by event id")
    move = cluster_commands.add_parser(
        "move", help="move a board group to a node (its primary hands it over once the "
                     "node caught up)")
    move.add_argument("group", type=int)
    move.add_argument("node")
    move.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                      help="wait up to this long for the node to write the group")
    rebalance = cluster_commands.add_parser(
        "rebalance", help="have the planner spread the groups' primaries evenly again")
    drain = cluster_commands.add_parser(
        "drain", help="move every board group off a node (before maintenance)")
    drain.add_argument("node")
    drain.add_argument("--cancel", action="store_true", help="stop draining the node")
    for action in (status, resubmit, move, rebalance, drain):
        connection_options(action, argparse.SUPPRESS, argparse.SUPPRESS)
    resubmit.add_argument("file", type=Path, help="a wal/orphan-* file")
    resubmit.add_argument("--without-event-id", action="store_true",
                          help="also send events without an event id (may apply one twice)")
    regroup = cluster_commands.add_parser(
        "migrate-slots", help="regroup a cluster made before hash slots (every node stopped)")
    regroup.add_argument("--dsn", required=True, help="the cluster's --cluster-dsn")
    load = remote("import", "bulk-load submissions from CSV or JSONL into a board")
    load.add_argument("file", type=Path, help="CSV with a header (member, score or delta, "
                                              "event_id, label) or JSONL")
    load.add_argument("--board", required=True)
    load.add_argument("--format", choices=("csv", "jsonl"),
                      help="default: from the file's extension")
    return parser


def admin_default_url() -> str:
    return os.environ.get("RANKD_URL", "http://127.0.0.1:7700")


def connection_options(command: argparse.ArgumentParser, url: str, token: str | None) -> None:
    """``--url`` and ``--token`` of a command that talks to a running daemon."""
    command.add_argument("--url", default=url, type=_daemon_url,
                         help="the daemon's HTTP address, http:// when it names no scheme "
                              "(env: RANKD_URL)")
    command.add_argument("--token", default=token, help="a JWT or API key (env: RANKD_TOKEN)")


def _daemon_url(text: str) -> str:
    from rankd.admin import daemon_url

    try:
        return daemon_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _serve(args: argparse.Namespace) -> int:
    try:
        settings = config.resolve(args)
    except config.ConfigError as exc:
        print(f"rankd: {exc}", file=sys.stderr)
        return 2
    from rankd.engine.snapshot import SnapshotError
    from rankd.engine.wal import WalCorruptError
    from rankd.server import StoppedAfterFailure, run

    try:
        run(settings)
    except config.ConfigError as exc:
        print(f"rankd: {exc}", file=sys.stderr)
        return 2
    # The data dir is locked by another daemon, is damaged, or the disk
    # failed while serving, a port is taken, Postgres cannot be used (a
    # StartupError): one line that says so, not a traceback.
    except (RuntimeError, WalCorruptError, SnapshotError, StoppedAfterFailure) as exc:
        print(f"rankd: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a listener or Postgres failing says so itself (StartupError)
        print(f"rankd: {exc}", file=sys.stderr)
        return 1
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from rankd.security.auth import new_api_key

    key, entry = new_api_key(args.key_id, args.scopes)
    print(f"API key (secret, shown once):  {key}")
    print(f"server entry for --api-keys:    {entry}")
    return 0


def _restore(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from tqdm import tqdm

    from rankd.engine.engine import Engine
    from rankd.engine.postgres import restore

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tqdm(unit="event", file=sys.stderr, desc="restore",
              disable=not sys.stderr.isatty()) as bar:
        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        last = asyncio.run(restore(args.dsn, args.data_dir, Engine.rebuild,
                                    progress=progress))
    print(f"restored {args.data_dir} up to event {last}; start it with "
          f"rankd serve --data-dir {args.data_dir}")
    return 0


def _wal(args: argparse.Namespace) -> int:
    from rankd.admin import wal_inspect

    return wal_inspect(args.data_dir)


def _snapshot(args: argparse.Namespace) -> int:
    from rankd.admin import Api

    info = Api(args.url, args.token).call("POST", "/v1/admin/snapshot")
    print(f"snapshot at position {info['position']}: {info['bytes']} bytes in "
          f"{info['seconds']:.2f}s ({info['path']})")
    return 0


def _export(args: argparse.Namespace) -> int:
    from rankd.admin import Api, export

    api = Api(args.url, args.token)
    if args.output is None:
        try:
            count = export(api, args.board, args.window, args.period, args.format)
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader went away (`| head`): stop quietly, as other tools do.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    else:
        with open(args.output, "w", newline="", encoding="utf-8") as out:
            count = export(api, args.board, args.window, args.period, args.format, out)
    print(f"exported {count} members", file=sys.stderr)
    return 0


def _import(args: argparse.Namespace) -> int:
    from rankd.admin import Api, import_events, read_events

    fmt = args.format or ("jsonl" if args.file.suffix in (".jsonl", ".ndjson") else "csv")
    with open(args.file, encoding="utf-8") as source:
        total = max(0, sum(1 for line in source if line.strip()) - (fmt == "csv"))
    with open(args.file, newline="", encoding="utf-8") as source:
        done = import_events(Api(args.url, args.token), args.board,
                             read_events(source, fmt), total)
    for error in done.errors[:20]:
        print(f"rejected {error}", file=sys.stderr)
    if len(done.errors) > 20:
        print(f"... and {len(done.errors) - 20} more rejected", file=sys.stderr)
    print(f"imported {done.applied} of {done.applied + done.duplicates + len(done.errors)} "
          f"events ({done.duplicates} already there, {len(done.errors)} rejected)",
          file=sys.stderr)
    return 1 if done.errors else 0


def _top(args: argparse.Namespace) -> int:
    from rankd.admin import Api, top_table

    top_table(Api(args.url, args.token), args.board, args.window, args.period, args.limit)
    return 0


def _cluster(args: argparse.Namespace) -> int:
    from rankd.admin import Api, move_group, resubmit_orphans

    if args.cluster_command == "migrate-slots":
        return _migrate_slots(args.dsn)
    api = Api(args.url, args.token)
    if args.cluster_command == "resubmit":
        return 1 if resubmit_orphans(api, args.file,
                                     without_event_id=args.without_event_id) else 0
    if args.cluster_command == "move":
        return move_group(api, args.group, args.node, args.wait)
    if args.cluster_command == "rebalance":
        api.call("POST", "/v1/cluster/rebalance")
        print("the planner rebalances the primaries at its next round")
        return 0
    if args.cluster_command == "drain":
        answer = api.call("POST", "/v1/cluster/drain", {"node": args.node,
                                                        "cancel": args.cancel})
        print(f"node {answer['node']} is " + ("drained: its groups move away (see `rankd "
                                              "cluster status`)" if answer["draining"]
                                              else "no longer drained"))
        return 0
    status = api.call("GET", "/v1/cluster")
    placement = status.get("placement", {})
    for node in status["nodes"]:
        state = "alive" if node["alive"] else f"silent {node['silent_seconds']:.0f}s"
        print(f"node {node['node']:<20} {node['advertise']:<24} {state}" + _disk(node))
    for group in status["groups"]:
        lags = ", ".join(f"{name} lag {f['lag']}" for name, f in group["followers"].items())
        print(f"group {group['group']:>4}  epoch {group['epoch']:<4} primary "
              f"{group['primary'] or '-':<20} last {group['last_seq']:<8} {lags}")
    members = {node["node"]: node.get("members") for node in status["nodes"]}
    for name, counts in sorted(placement.get("per_node", {}).items()):
        held = members.get(name)
        print(f"placed {name:<20} primary of {counts['primary']} groups, follows "
              f"{counts['follower']}" + (f", {held:,} members" if held is not None else ""))
    for move in placement.get("moves", []):
        print(f"move  group {move['group']:>4} to {move['target']} (in progress)")
    if status.get("replicas_all"):
        print("replicas all (on every node): groups "
              + ", ".join(str(g) for g in status["replicas_all"]))
    if placement:
        print(f"topology epoch {placement['topology_epoch']}")
    return 0


def _disk(node: dict) -> str:
    """A node's disk as it reports it to the planner (rankd.cluster.capacity)."""
    if node.get("log_failed"):
        return ", local log FAILED (given no group)"
    free = node.get("free_bytes")
    return f", {free / (1 << 30):.1f} GiB free" if free is not None else ""


def _migrate_slots(dsn: str) -> int:
    import asyncio

    from rankd.cluster.migrate_slots import MigrationRefused, migrate_slots

    try:
        done = asyncio.run(migrate_slots(dsn))
    except MigrationRefused as exc:
        print(f"rankd: {exc}", file=sys.stderr)
        return 1
    print(f"regrouped {done['boards']} boards ({done['records']} log records) from "
          f"{done['old_groups']} CRC-32 groups into {done['new_groups']} slot groups; "
          "start the nodes with empty data dirs")
    return 0


COMMANDS = {"serve": _serve, "keygen": _keygen, "restore": _restore, "wal": _wal,
            "snapshot": _snapshot, "export": _export, "import": _import, "top": _top,
            "cluster": _cluster}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rankd.admin import AdminError

    try:
        return COMMANDS[args.command](args)
    except (AdminError, ValueError, RuntimeError, OSError) as exc:
        print(f"rankd {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
