"""ACL categories of the commands, as Redis 7.2's ``COMMAND INFO`` lists
them (``@sortedset``, not the docs group ``sorted-set``), and ``COMMAND
LIST [FILTERBY MODULE name | ACLCAT category | PATTERN pattern]``.

The table is what ``redis-server`` answers (checked by
``tests/test_resp_small_answers.py``); rankd's own commands get what Redis
would derive from their flags (``@read``/``@write``, ``@fast``/``@slow``)
and ``@sortedset``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from rankd.frontends.resp.arguments import CommandError, glob_match

if TYPE_CHECKING:
    from rankd.frontends.resp.context import Command, Context

_WRITE_SORTED = ("@write", "@sortedset", "@fast")
_READ_SORTED = ("@read", "@sortedset", "@fast")
_READ_SORTED_SLOW = ("@read", "@sortedset", "@slow")
_CONNECTION = ("@fast", "@connection")
_CONNECTION_SLOW = ("@slow", "@connection")
_ADMIN = ("@admin", "@slow", "@dangerous")

#: Categories by command name (subcommands as ``container|sub``).
ACL_CATEGORIES: dict[str, tuple[str, ...]] = {
    "zadd": _WRITE_SORTED, "zincrby": _WRITE_SORTED, "zscore": _READ_SORTED,
    "zmscore": _READ_SORTED, "zrank": _READ_SORTED, "zrevrank": _READ_SORTED,
    "zcard": _READ_SORTED, "zcount": _READ_SORTED, "zrange": _READ_SORTED_SLOW,
    "zrevrange": _READ_SORTED_SLOW, "zrangebyscore": _READ_SORTED_SLOW,
    "zrevrangebyscore": _READ_SORTED_SLOW, "zscan": _READ_SORTED_SLOW,
    "zrem": _WRITE_SORTED, "zremrangebyrank": ("@write", "@sortedset", "@slow"),
    "zremrangebyscore": ("@write", "@sortedset", "@slow"), "zpopmin": _WRITE_SORTED,
    "zpopmax": _WRITE_SORTED,
    "del": ("@keyspace", "@write", "@slow"), "exists": ("@keyspace", "@read", "@fast"),
    "type": ("@keyspace", "@read", "@fast"), "scan": ("@keyspace", "@read", "@slow"),
    "keys": ("@keyspace", "@read", "@slow", "@dangerous"),
    "dbsize": ("@keyspace", "@read", "@fast"),
    "flushdb": ("@keyspace", "@write", "@slow", "@dangerous"),
    "flushall": ("@keyspace", "@write", "@slow", "@dangerous"),
    "ping": _CONNECTION, "echo": _CONNECTION, "quit": _CONNECTION, "reset": _CONNECTION,
    "select": _CONNECTION, "auth": _CONNECTION, "hello": _CONNECTION,
    "client": ("@slow",), "client|setname": _CONNECTION_SLOW,
    "client|getname": _CONNECTION_SLOW, "client|id": _CONNECTION_SLOW,
    "client|setinfo": _CONNECTION_SLOW, "client|info": _CONNECTION_SLOW,
    "client|list": (*_ADMIN, "@connection"), "client|no-evict": (*_ADMIN, "@connection"),
    "client|no-touch": _CONNECTION_SLOW, "client|help": _CONNECTION_SLOW,
    "info": ("@slow", "@dangerous"),
    "config": ("@slow",), "config|get": _ADMIN, "config|set": _ADMIN,
    "config|resetstat": _ADMIN, "config|help": ("@slow",),
    "command": _CONNECTION_SLOW, "command|count": _CONNECTION_SLOW,
    "command|info": _CONNECTION_SLOW, "command|docs": _CONNECTION_SLOW,
    "command|list": _CONNECTION_SLOW, "command|getkeys": _CONNECTION_SLOW,
    "readonly": _CONNECTION, "readwrite": _CONNECTION, "asking": _CONNECTION,
    "unlink": ("@keyspace", "@write", "@fast"), "time": ("@fast",),
    "object": ("@slow",), "object|encoding": ("@keyspace", "@read", "@slow"),
    "object|freq": ("@keyspace", "@read", "@slow"), "object|help": ("@keyspace", "@slow"),
    "memory": ("@slow",), "memory|usage": ("@read", "@slow"), "memory|help": ("@slow",),
    # Transactions, expiry, aggregations, lex ranges and pops (issue 45):
    "multi": ("@fast", "@transaction"), "exec": ("@slow", "@transaction"),
    "discard": ("@fast", "@transaction"), "watch": ("@fast", "@transaction"),
    "unwatch": ("@fast", "@transaction"),
    "expire": ("@keyspace", "@write", "@fast"), "pexpire": ("@keyspace", "@write", "@fast"),
    "expireat": ("@keyspace", "@write", "@fast"),
    "pexpireat": ("@keyspace", "@write", "@fast"), "persist": ("@keyspace", "@write", "@fast"),
    "ttl": ("@keyspace", "@read", "@fast"), "pttl": ("@keyspace", "@read", "@fast"),
    "expiretime": ("@keyspace", "@read", "@fast"),
    "pexpiretime": ("@keyspace", "@read", "@fast"),
    "zunion": _READ_SORTED_SLOW, "zinter": _READ_SORTED_SLOW, "zdiff": _READ_SORTED_SLOW,
    "zintercard": _READ_SORTED_SLOW, "zunionstore": ("@write", "@sortedset", "@slow"),
    "zinterstore": ("@write", "@sortedset", "@slow"),
    "zdiffstore": ("@write", "@sortedset", "@slow"),
    "zrangestore": ("@write", "@sortedset", "@slow"),
    "zrangebylex": _READ_SORTED_SLOW, "zrevrangebylex": _READ_SORTED_SLOW,
    "zlexcount": _READ_SORTED, "zremrangebylex": ("@write", "@sortedset", "@slow"),
    "zrandmember": _READ_SORTED_SLOW, "zmpop": ("@write", "@sortedset", "@slow"),
    "bzpopmin": ("@write", "@sortedset", "@fast", "@blocking"),
    "bzpopmax": ("@write", "@sortedset", "@fast", "@blocking"),
    "bzmpop": ("@write", "@sortedset", "@slow", "@blocking"),
    # MONITOR (issue 45, item 8):
    "monitor": _ADMIN,
}

#: Redis's category names (``ACL CAT``): what FILTERBY ACLCAT accepts.
KNOWN = frozenset(["keyspace", "read", "write", "set", "sortedset", "list", "hash", "string",
                   "bitmap", "hyperloglog", "geo", "stream", "pubsub", "admin", "fast", "slow",
                   "blocking", "dangerous", "connection", "transaction", "scripting"])


def categories_of(command: Command) -> tuple[str, ...]:
    """``command``'s categories: the table's, else derived from its flags as
    Redis derives them (rankd's own commands; commands added since)."""
    found = ACL_CATEGORIES.get(command.name)
    if found is not None:
        return found
    derived = []
    if "write" in command.flags:
        derived.append("@write")
    elif "readonly" in command.flags:
        derived.append("@read")
    if command.group == "sorted-set" or command.name.startswith("rankd."):
        derived.append("@sortedset")
    derived.append("@fast" if "fast" in command.flags else "@slow")
    return tuple(derived)


def _every(commands: dict[bytes, Command]) -> Iterator[Command]:
    """Each command, then its subcommands (Redis's order of COMMAND LIST)."""
    for command in commands.values():
        yield command
        yield from command.subcommands.values()


def command_list(conn: Context, args: list[bytes], commands: dict[bytes, Command]) -> bytes:
    """COMMAND LIST [FILTERBY MODULE name | ACLCAT category | PATTERN pattern]:
    every command and subcommand name of the table ``commands``, or those
    the filter keeps (rankd has no modules: none of theirs).  As Redis, the
    last FILTERBY counts."""
    kind = argument = None
    position = 2
    while position < len(args):
        if args[position].lower() != b"filterby" or len(args) - 1 - position != 2:
            raise CommandError("ERR syntax error")
        kind, argument = args[position + 1].lower(), args[position + 2]
        if kind not in (b"module", b"aclcat", b"pattern"):
            raise CommandError("ERR syntax error")
        position += 3
    names = [command.name.encode() for command in _every(commands)]
    if kind == b"module":
        names = []
    elif kind == b"aclcat":
        category = argument.lower().decode("latin-1")
        names = [] if category not in KNOWN else [
            command.name.encode() for command in _every(commands)
            if f"@{category}" in categories_of(command)]
    elif kind == b"pattern" and argument is not None:
        names = [name for name in names if glob_match(argument, name, nocase=True)]
    replies = conn.replies
    return replies.array_header(len(names)) + b"".join(replies.bulk(name) for name in names)
