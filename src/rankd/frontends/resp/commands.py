"""The RESP command table, and the commands of the connection itself.

:data:`COMMANDS` is assembled here, and only here, from the command
modules (:mod:`.sorted_sets`, :mod:`.expiry`, :mod:`.aggregates`,
:mod:`.pops`, :mod:`.transactions`, :mod:`.monitor`, :mod:`.tooling`...),
which this module imports; :mod:`.connection` imports the table, and no
command module imports either (a handler is given the connection's
:class:`~.context.Context`, and :class:`~.context.Command` is defined
there).

:func:`lookup` finds a command by name (any case) and checks its arity the
way Redis does, with Redis's error texts; each :class:`Command` names the
Gate operation it amounts to (its scope and rate limit), or None for the
commands every client sends before or around authentication (``HELLO``,
``AUTH``, ``PING``...).  The sorted-set and keyspace commands live in
:mod:`.sorted_sets`; this module holds the handshake and tooling set:
what clients, ``redis-cli``, ``redis-benchmark`` and exporters send, and
the introspection of the table (``COMMAND``).

rankd's own commands (``RANKD.*``, a name no Redis command has) reach what
Redis lacks: dense and competition ranks and percentiles, a member's
neighbours, a friends list ranked, and the window and period reads use.
"""

from __future__ import annotations

import os
import resource
from typing import TYPE_CHECKING, Any

from rankd import __version__
from rankd.engine.errors import EngineError
from rankd.engine.periods import WINDOWS
from rankd.frontends.resp import (
    aggregates,
    blocking,
    categories,
    cluster_commands,
    expiry,
    monitor,
    pops,
    tooling,
    transactions,
)
from rankd.frontends.resp import info as info_sections
from rankd.frontends.resp import sorted_sets as zset
from rankd.frontends.resp.arguments import SYNTAX, CommandError, glob_match, integer, text
from rankd.frontends.resp.context import Command, Handler
from rankd.frontends.resp.protocol import Replies

if TYPE_CHECKING:
    from rankd.frontends.resp.context import Context

#: The Redis version rankd answers as (what clients check for features:
#: ``ZRANK ... WITHSCORE`` and ``CLIENT SETINFO`` are 7.2's).
REDIS_VERSION = "7.2.0"


def lookup(words: list[bytes]) -> Command:
    """The command ``words`` call, arity checked (``CommandError`` as Redis words it)."""
    name = words[0].lower()
    command = COMMANDS.get(name)
    if command is None:
        raise CommandError(unknown_command(words))
    if command.subcommands and len(words) >= 2:
        sub = command.subcommands.get(words[1].lower())
        if sub is None:
            raise CommandError(f"ERR unknown subcommand '{_shown(words[1])}'. Try "
                               f"{command.name.upper()} HELP.")
        command = sub
    arity = command.arity
    if (arity > 0 and len(words) != arity) or len(words) < -arity:
        raise CommandError(f"ERR wrong number of arguments for '{command.name}' command")
    return command


def _shown(word: bytes, limit: int = 128) -> str:
    return word[:limit].decode(errors="replace").replace("\r", " ").replace("\n", " ")


def unknown_command(words: list[bytes]) -> str:
    """Redis's error for a command it does not know."""
    args = ""
    for word in words[1:]:
        if len(args) >= 128:
            break
        args += f"'{_shown(word, 128 - len(args))}' "
    return f"ERR unknown command '{_shown(words[0])}', with args beginning with: {args}"


# --- connection ----------------------------------------------------------------------


def ping(conn: Context, args: list[bytes]) -> bytes:
    if len(args) > 2:
        raise CommandError("ERR wrong number of arguments for 'ping' command")
    return conn.replies.bulk(args[1]) if len(args) == 2 else conn.replies.simple("PONG")


def echo(conn: Context, args: list[bytes]) -> bytes:
    return conn.replies.bulk(args[1])


def quit_(conn: Context, args: list[bytes]) -> bytes:
    conn.quitting = True
    return conn.replies.simple("OK")


def reset(conn: Context, args: list[bytes]) -> bytes:
    conn.reset()
    return conn.replies.simple("RESET")


def select(conn: Context, args: list[bytes]) -> bytes:
    if integer(args[1]) != 0:
        raise CommandError("ERR DB index is out of range")
    return conn.replies.simple("OK")


def auth(conn: Context, args: list[bytes]) -> bytes:
    """AUTH [username] password: the password is an API key or a JWT."""
    if len(args) > 3:
        raise CommandError(SYNTAX)
    if not conn.gate.auth_enabled:
        raise CommandError("ERR AUTH <password> called without any password configured "
                           "for the default user. Are you sure your configuration is correct?")
    conn.authenticate(args[-1].decode(errors="replace"))
    return conn.replies.simple("OK")


def hello(conn: Context, args: list[bytes]) -> bytes:
    """HELLO [protover [AUTH username password] [SETNAME clientname]]"""
    version = conn.replies.version
    if len(args) >= 2:
        version = integer(args[1], "ERR Protocol version is not an integer or out of range")
        if version not in (2, 3):
            raise CommandError("NOPROTO unsupported protocol version")
    credential = name = None
    position = 2
    while position < len(args):
        option = args[position].lower()
        left = len(args) - position - 1
        if option == b"auth" and left >= 2:
            credential = args[position + 2].decode(errors="replace")
            position += 3
        elif option == b"setname" and left >= 1:
            name = _client_name(args[position + 1])
            position += 2
        else:
            raise CommandError(f"ERR Syntax error in HELLO option '{_shown(args[position])}'")
    if credential is not None:
        if conn.gate.auth_enabled:
            conn.authenticate(credential)
    elif not conn.authenticated:
        raise CommandError("NOAUTH HELLO must be called with the client already "
                           "authenticated, otherwise the HELLO <proto> AUTH <user> <pass> "
                           "option can be used to authenticate the client and select the "
                           "RESP protocol version at the same time")
    if name is not None:
        conn.name = name or None
    conn.replies = Replies(version)
    replies = conn.replies
    fields = [("server", replies.bulk("redis")), ("version", replies.bulk(REDIS_VERSION)),
              ("proto", replies.integer(version)), ("id", replies.integer(conn.id)),
              ("mode", replies.bulk("cluster" if conn.service.topology is not None
                                    else "standalone")), ("role", replies.bulk("master")),
              ("modules", replies.array_header(0))]
    return replies.map_header(len(fields)) + b"".join(
        replies.bulk(key) + value for key, value in fields)


def _client_name(word: bytes) -> str:
    if any(c <= 0x20 or c > 0x7E for c in word):
        raise CommandError("ERR Client names cannot contain spaces, newlines or special "
                           "characters.")
    return word.decode()


def client_setname(conn: Context, args: list[bytes]) -> bytes:
    conn.name = _client_name(args[2]) or None
    return conn.replies.simple("OK")


def client_getname(conn: Context, args: list[bytes]) -> bytes:
    return conn.replies.bulk(conn.name)


def client_id(conn: Context, args: list[bytes]) -> bytes:
    return conn.replies.integer(conn.id)


def client_setinfo(conn: Context, args: list[bytes]) -> bytes:
    attribute = args[2].lower().decode(errors="replace")
    if attribute not in ("lib-name", "lib-ver"):
        raise CommandError(f"ERR Unrecognized option '{_shown(args[2])}'")
    if any(c <= 0x20 or c > 0x7E for c in args[3]):
        raise CommandError(f"ERR {attribute} cannot contain spaces, newlines or special "
                           "characters.")
    conn.library[attribute] = args[3].decode()
    return conn.replies.simple("OK")


def client_info(conn: Context, args: list[bytes]) -> bytes:
    return conn.replies.bulk(conn.describe() + "\n")


def client_list(conn: Context, args: list[bytes]) -> bytes:
    return conn.replies.bulk("".join(c.describe() + "\n" for c in conn.server.connections))


def client_noop(conn: Context, args: list[bytes]) -> bytes:
    """CLIENT NO-EVICT|NO-TOUCH on|off: nothing is evicted or touched here."""
    if args[2].lower() not in (b"on", b"off"):
        raise CommandError(SYNTAX)
    return conn.replies.simple("OK")


# --- tooling ------------------------------------------------------------------------------


def _info_sections(conn: Context) -> dict[str, list[tuple[str, object]]]:
    server = conn.server
    service = conn.service
    now = conn.loop.time()
    uptime = int(now - server.started_at)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        with open("/proc/self/statm") as statm:
            rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        rss = usage.ru_maxrss * 1024
    stats = service.engine.stats
    counts = server.counts()
    commands = sum(counts.values())
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    fsync = server.settings.get("fsync", "everysec")
    return {
        "server": [("redis_version", REDIS_VERSION), ("rankd_version", __version__),
                   ("redis_mode", "standalone"), ("os", os.uname().sysname),
                   ("arch_bits", 64), ("process_id", os.getpid()),
                   ("tcp_port", server.settings.get("port", 0)),
                   ("uptime_in_seconds", uptime), ("uptime_in_days", uptime // 86400)],
        "clients": [("connected_clients", len(server.connections)),
                    ("blocked_clients", len(blocking.blocked(service.engine))),
                    ("maxclients", server.limits.max_total)],
        "memory": [("used_memory", rss), ("used_memory_human", f"{rss / 1048576:.2f}M"),
                   ("used_memory_rss", rss), ("maxmemory", 0),
                   ("maxmemory_policy", "noeviction")],
        "persistence": [("loading", 0 if service.engine.ready else 1),
                        ("aof_enabled", 1), ("appendfsync", fsync),
                        ("rdb_changes_since_last_save", 0)],
        "stats": [("total_connections_received", server.total_connections),
                  ("total_commands_processed", commands),
                  ("rankd_events_applied", stats["applied"]),
                  ("rankd_events_duplicate", stats["duplicate"]),
                  ("rankd_events_rejected", stats["rejected"]),
                  ("rankd_native_writes", counts[("write", "ok")]),
                  ("rankd_native_reads", counts[("read", "ok")]),
                  ("keyspace_hits", 0), ("keyspace_misses", 0)],
        "replication": info_sections.replication(),
        "cpu": [("used_cpu_sys", f"{usage.ru_stime:.6f}"),
                ("used_cpu_user", f"{usage.ru_utime:.6f}"),
                ("used_cpu_sys_children", f"{children.ru_stime:.6f}"),
                ("used_cpu_user_children", f"{children.ru_utime:.6f}")],
        "commandstats": info_sections.commandstats(counts),
        "errorstats": info_sections.errorstats(),
        "cluster": [("cluster_enabled", int(conn.service.topology is not None))],
        "keyspace": ([("db0", f"keys={keys},expires=0,avg_ttl=0")]
                     if (keys := len(zset.key_names(conn))) else []),
    }


def info(conn: Context, args: list[bytes]) -> bytes:
    """INFO [section ...]"""
    names = info_sections.wanted(args[1:])
    return conn.replies.bulk(info_sections.render(_info_sections(conn), names))


def config_get(conn: Context, args: list[bytes]) -> bytes:
    """CONFIG GET parameter [parameter ...]: what tools ask (redis-benchmark
    asks for ``save`` and ``appendonly``), as rankd runs."""
    settings = conn.server.settings
    fsync = settings.get("fsync", "everysec")
    known = {"save": "", "appendonly": "yes", "appendfsync": fsync, "databases": "1",
             "maxmemory": "0", "maxmemory-policy": "noeviction",
             "maxclients": str(conn.server.limits.max_total),
             "timeout": f"{conn.server.idle_timeout:g}", "port": str(settings.get("port", 0)),
             "proto-max-bulk-len": str(conn.server.max_bulk),
             "zset-max-listpack-entries": str(zset.SCAN_WHOLE)}
    found = {key: value for pattern in args[2:] for key, value in known.items()
             if glob_match(pattern, key.encode(), nocase=True)}
    replies = conn.replies
    return replies.map_header(len(found)) + b"".join(
        replies.bulk(key) + replies.bulk(value) for key, value in found.items())


def config_set(conn: Context, args: list[bytes]) -> bytes:
    raise CommandError("ERR rankd's configuration is set when it starts (rankd serve "
                       "options); CONFIG SET changes nothing")


def config_resetstat(conn: Context, args: list[bytes]) -> bytes:
    conn.server.reset_counts()
    info_sections.ERRORS.clear()
    return conn.replies.simple("OK")


#: Names one COMMAND INFO / COMMAND DOCS may ask for (Redis has ~240 commands).
MAX_COMMAND_NAMES = 1024
#: The introspection entries, built once per protocol version and command.
_ENTRIES: dict[tuple[int, str], bytes] = {}


def _command_entry(replies: Replies, command: Command) -> bytes:
    """One entry of COMMAND / COMMAND INFO, as Redis 7 lays it out (built
    once, then cached: a client may ask for the same entry many times)."""
    key = (replies.version, command.name)
    entry = _ENTRIES.get(key)
    if entry is None:
        entry = _ENTRIES[key] = _build_entry(replies, command)
    return entry


def _build_entry(replies: Replies, command: Command) -> bytes:
    parts = [replies.array_header(10), replies.bulk(command.name),
             replies.integer(command.arity), replies.array_header(len(command.flags)),
             *[replies.simple(flag) for flag in command.flags],
             replies.integer(command.first_key), replies.integer(command.last_key),
             replies.integer(1 if command.first_key else 0),
             *_categories(replies, command),
             replies.array_header(0), replies.array_header(0)]
    subs = list(command.subcommands.values())
    parts.append(replies.array_header(len(subs)))
    parts += [_command_entry(replies, sub) for sub in subs]
    return b"".join(parts)


def _categories(replies: Replies, command: Command) -> list[bytes]:
    found = categories.categories_of(command)
    return [replies.array_header(len(found)), *map(replies.simple, found)]


def command_(conn: Context, args: list[bytes]) -> bytes:
    """COMMAND: every command's entry."""
    commands = list(COMMANDS.values())
    return conn.replies.array_header(len(commands)) + b"".join(
        _command_entry(conn.replies, c) for c in commands)


def command_count(conn: Context, args: list[bytes]) -> bytes:
    return conn.replies.integer(len(COMMANDS))


def command_list(conn: Context, args: list[bytes]) -> bytes:
    """COMMAND LIST [FILTERBY ...] of this table (:func:`.categories.command_list`)."""
    return categories.command_list(conn, args, COMMANDS)


def _names(args: list[bytes]) -> list[bytes]:
    """The names a COMMAND INFO or DOCS asks for, at most :data:`MAX_COMMAND_NAMES`."""
    if len(args) - 2 > MAX_COMMAND_NAMES:
        raise CommandError(f"ERR at most {MAX_COMMAND_NAMES} command names at once")
    return args[2:]


def _names_cost(words: list[bytes]) -> int:
    """COMMAND INFO and DOCS are charged a request per name asked for."""
    return max(1, len(words) - 2)


def _named(name: bytes) -> Command | None:
    """The command or subcommand (``client|list``) ``name`` names."""
    container, _, sub = name.partition(b"|")
    command = COMMANDS.get(container)
    if sub and command is not None:
        return command.subcommands.get(sub)
    return command


def command_info(conn: Context, args: list[bytes]) -> bytes:
    replies = conn.replies
    names = _names(args) or list(COMMANDS)
    out = [replies.array_header(len(names))]
    for name in names:
        command = _named(name.lower() if isinstance(name, bytes) else name)
        out.append(replies.null() if command is None else
                   _command_entry(replies, command))
    return b"".join(out)


def command_docs(conn: Context, args: list[bytes]) -> bytes:
    """COMMAND DOCS [name ...]: summary and group of each (what redis-cli
    shows as hints), rankd's own commands included."""
    replies = conn.replies
    wanted = [COMMANDS.get(name.lower()) for name in _names(args)] if len(args) > 2 \
        else list(COMMANDS.values())
    found = [c for c in wanted if c is not None]
    out = [replies.map_header(len(found))]
    for command in found:
        out += [replies.bulk(command.name), replies.map_header(3),
                replies.bulk("summary"), replies.bulk(command.summary or command.name),
                replies.bulk("since"), replies.bulk("1.0.0"),
                replies.bulk("group"), replies.bulk(command.group)]
    return b"".join(out)


# --- rankd's own ------------------------------------------------------------------------


def command_getkeys(conn: Context, args: list[bytes]) -> bytes:
    """COMMAND GETKEYS command [arg ...]: the keys it names (Redis's errors)."""
    words = args[2:]
    command = COMMANDS.get(words[0].lower())
    if command is None:
        raise CommandError("ERR Invalid command specified")
    if command.subcommands and len(words) >= 2:
        command = command.subcommands.get(words[1].lower(), command)
    if (command.arity > 0 and len(words) != command.arity) or len(words) < -command.arity:
        raise CommandError("ERR Invalid number of arguments specified for command")
    keys = cluster_commands.command_keys(command, words)
    if not keys:
        raise CommandError("ERR The command has no key arguments")
    return conn.replies.array_header(len(keys)) + b"".join(conn.replies.bulk(k) for k in keys)


def _board(conn: Context, key: bytes) -> str:
    name = zset.board_name(key)
    if name is None or not conn.service.has_board(name):
        raise CommandError("ERR no such key")
    return name


def _pairs(replies: Replies, fields: list[tuple[str, object]]) -> bytes:
    out = [replies.map_header(len(fields))]
    for key, value in fields:
        out.append(replies.bulk(key))
        if value is None:
            out.append(replies.null())
        elif isinstance(value, float):
            out.append(replies.double(value))
        elif isinstance(value, int):
            out.append(replies.integer(value))
        else:
            out.append(replies.bulk(str(value)))
    return b"".join(out)


def rankd_rank(conn: Context, args: list[bytes]) -> bytes:
    """RANKD.RANK key member: the member's standing, every kind of rank
    (1 is the board's best), or null."""
    name = _board(conn, args[1])
    member = text(args[2])
    try:
        standing = conn.service.member(name, member or "", window=conn.window,
                                       period=conn.period) if member else None
    except EngineError as exc:
        if exc.code != "not_found":
            raise
        standing = None
    if standing is None:
        return conn.replies.null()
    return _pairs(conn.replies, [
        (key, standing[key]) for key in ("rank", "competition_rank", "dense_rank",
                                         "percentile", "score", "total")])


def _ranked(replies: Replies, entries: list[dict[str, Any]], *, list_rank: bool = False
            ) -> bytes:
    out = [replies.array_header(len(entries))]
    for entry in entries:
        fields = [("rank", entry["rank"]), ("member", entry["member"]),
                  ("score", float(entry["score"]))]
        if list_rank:
            fields.insert(1, ("list_rank", entry["list_rank"]))
        out.append(_pairs(replies, fields))
    return b"".join(out)


def rankd_friends(conn: Context, args: list[bytes]) -> bytes:
    """RANKD.FRIENDS key member [member ...]: those members ranked among
    themselves (list_rank) and on the board (rank); absent ones left out."""
    name = _board(conn, args[1])
    members = [m for m in map(text, args[2:]) if m]
    ranked = conn.service.ranks(name, members, window=conn.window, period=conn.period)
    return _ranked(conn.replies, ranked["entries"], list_rank=True)


def rankd_around(conn: Context, args: list[bytes]) -> bytes:
    """RANKD.AROUND key member [above below]: the member's neighbours on the
    board's ranking (best first), or an empty array if absent."""
    if len(args) not in (3, 5):
        raise CommandError(SYNTAX)
    name = _board(conn, args[1])
    above, below = (integer(args[3]), integer(args[4])) if len(args) == 5 else (4, 4)
    member = text(args[2])
    try:
        entries = conn.service.around(name, member or "", above=above, below=below,
                                      window=conn.window, period=conn.period)["entries"]
    except EngineError as exc:
        if exc.code != "not_found":
            raise
        entries = []
    return _ranked(conn.replies, entries)


def rankd_window(conn: Context, args: list[bytes]) -> bytes:
    """RANKD.WINDOW [window [period]]: the window (and closed period) this
    connection's reads use; with no argument, each board's own again."""
    if len(args) > 3:
        raise CommandError(SYNTAX)
    window = text(args[1]) if len(args) >= 2 else None
    if window is not None and window not in WINDOWS:
        raise CommandError(f"ERR unknown window {window!r}; windows are {', '.join(WINDOWS)}")
    conn.window = window
    conn.period = text(args[2]) if len(args) == 3 else None
    return conn.replies.simple("OK")


def _count_pairs(words: list[bytes]) -> int:
    return max(1, (len(words) - 2) // 2)


def _by_members(words: list[bytes]) -> int:
    """A command of a key and members: charged by its members' work."""
    return zset.work_cost(len(words) - 2)


def _by_keys(words: list[bytes]) -> int:
    return zset.work_cost(len(words) - 1)


def _command(name: str, arity: int, handler: Handler, operation: str | None,
             flags: tuple[str, ...] = (), keys: tuple[int, int] = (0, 0),
             group: str = "sorted-set", summary: str = "", **extra: Any) -> Command:
    return Command(name, arity, handler, operation, flags, keys[0], keys[1], group, summary,
                   **extra)


_WRITE = ("write", "denyoom", "fast")
_READ = ("readonly", "fast")
_KEY = (1, 1)


def _container(name: str, subcommands: list[Command], group: str) -> Command:
    def help_(conn: Context, args: list[bytes]) -> bytes:
        names = sorted(sub.name.split("|")[1].upper() for sub in subcommands)
        return conn.replies.array_header(len(names)) + b"".join(
            conn.replies.simple(n) for n in names)
    subs = {sub.name.split("|")[1].encode(): sub for sub in subcommands}
    subs[b"help"] = _command(f"{name}|help", 2, help_, None, ("loading", "stale"),
                             group=group)

    def missing(conn: Context, args: list[bytes]) -> bytes:
        raise CommandError(f"ERR wrong number of arguments for '{name}' command")
    return _command(name, -2, missing, None, group=group, subcommands=subs)


COMMANDS: dict[bytes, Command] = {c.name.encode(): c for c in [
    _command("zadd", -4, zset.zadd, "submit", ("write", "denyoom", "fast"), _KEY,
             summary="Add members, or update their scores", cost=_count_pairs,
             batchable=True, immediate=False),
    _command("zincrby", 4, zset.zincrby, "submit", _WRITE, _KEY,
             summary="Increment a member's score", batchable=True, immediate=False),
    _command("zscore", 3, zset.zscore, "top", _READ, _KEY, summary="A member's score"),
    _command("zmscore", -3, zset.zmscore, "top", _READ, _KEY, summary="Members' scores",
             cost=_by_members, immediate=False),
    _command("zrank", -3, zset.zrank, "top", _READ, _KEY,
             summary="A member's position, lowest score first"),
    _command("zrevrank", -3, zset.zrevrank, "top", _READ, _KEY,
             summary="A member's position, highest score first"),
    _command("zcard", 2, zset.zcard, "top", _READ, _KEY, summary="Number of members"),
    _command("zcount", 4, zset.zcount, "top", _READ, _KEY,
             summary="Members with a score in a range"),
    _command("zrange", -4, zset.zrange, "top", ("readonly",), _KEY,
             summary="Members in a range of positions or scores", immediate=False),
    _command("zrevrange", -4, zset.zrevrange, "top", ("readonly",), _KEY,
             summary="Members in a range of positions, highest first", immediate=False),
    _command("zrangebyscore", -4, zset.zrangebyscore, "top", ("readonly",), _KEY,
             summary="Members in a range of scores", immediate=False),
    _command("zrevrangebyscore", -4, zset.zrevrangebyscore, "top", ("readonly",), _KEY,
             summary="Members in a range of scores, highest first", immediate=False),
    _command("zscan", -3, zset.zscan, "top", ("readonly",), _KEY,
             summary="Iterate over members and scores"),
    _command("zrem", -3, zset.zrem, "remove_member", ("write", "fast"), _KEY,
             summary="Remove members", cost=_by_members, immediate=False),
    _command("zremrangebyrank", 4, zset.zremrangebyrank, "remove_member", ("write",), _KEY,
             summary="Remove members in a range of positions", immediate=False),
    _command("zremrangebyscore", 4, zset.zremrangebyscore, "remove_member", ("write",), _KEY,
             summary="Remove members in a range of scores", immediate=False),
    _command("zpopmin", -2, zset.zpopmin, "remove_member", ("write", "fast"), _KEY,
             summary="Remove and return the lowest-scored members", immediate=False,
             applied_now=True),
    _command("zpopmax", -2, zset.zpopmax, "remove_member", ("write", "fast"), _KEY,
             summary="Remove and return the highest-scored members", immediate=False,
             applied_now=True),
    _command("del", -2, zset.delete, "delete_board", ("write",), (1, -1), "keyspace",
             "Delete boards", immediate=False),
    _command("exists", -2, zset.exists, "list_boards", _READ, (1, -1), "keyspace",
             "Whether boards exist", cost=_by_keys, immediate=False),
    _command("type", 2, zset.type_, "list_boards", _READ, _KEY, "keyspace",
             "The type of a key (every board is a zset)"),
    _command("scan", -2, zset.scan, "list_boards", ("readonly",), group="keyspace",
             summary="Iterate over board names"),
    _command("keys", 2, zset.keys, "list_boards", ("readonly",), group="keyspace",
             summary="Board names matching a pattern"),
    _command("dbsize", 1, zset.dbsize, "list_boards", _READ, group="keyspace",
             summary="Number of boards"),
    _command("flushdb", -1, zset.flush, "delete_board", ("write",), group="keyspace",
             summary="Delete every board (admin scope)", immediate=False),
    _command("flushall", -1, zset.flush, "delete_board", ("write",), group="keyspace",
             summary="Delete every board (admin scope)", immediate=False),
    _command("ping", -1, ping, None, ("fast", "stale"), group="connection",
             summary="Ping the server"),
    _command("echo", 2, echo, None, ("fast",), group="connection", summary="Echo a string"),
    _command("quit", -1, quit_, None, ("fast", "no-auth"), group="connection",
             summary="Close the connection"),
    _command("reset", 1, reset, None, ("fast", "no-auth"), group="connection",
             summary="Reset the connection"),
    _command("select", 2, select, None, ("fast",), group="connection",
             summary="Select database 0 (the only one)"),
    _command("auth", -2, auth, None, ("fast", "no-auth"), group="connection",
             summary="Authenticate with an API key or a JWT"),
    _command("hello", -1, hello, None, ("fast", "no-auth"), group="connection",
             summary="Handshake: protocol version, authentication, name"),
    _container("client", [
        _command("client|setname", 3, client_setname, None, group="connection"),
        _command("client|getname", 2, client_getname, None, group="connection"),
        _command("client|id", 2, client_id, None, group="connection"),
        _command("client|setinfo", 4, client_setinfo, None, group="connection"),
        _command("client|info", 2, client_info, None, group="connection"),
        # Other clients' addresses and names: admin only.
        _command("client|list", -2, client_list, "client_list", group="connection"),
        _command("client|no-evict", 3, client_noop, None, group="connection"),
        _command("client|no-touch", 3, client_noop, None, group="connection"),
    ], "connection"),
    _command("info", -1, info, "metrics", ("loading", "stale"), group="server",
             summary="Server information and statistics"),
    _container("config", [
        _command("config|get", -3, config_get, "metrics", group="server"),
        _command("config|set", -4, config_set, "metrics", group="server"),
        # It wipes the counters of refused attempts: admin only.
        _command("config|resetstat", 2, config_resetstat, "config_resetstat", group="server"),
    ], "server"),
    _command("command", -1, command_, None, ("loading", "stale"), group="server",
             summary="Every command's details"),
    _command("rankd.rank", 3, rankd_rank, "member", _READ, _KEY, "rankd",
             "A member's rank, competition and dense rank, and percentile"),
    _command("rankd.friends", -3, rankd_friends, "ranks", _READ, _KEY, "rankd",
             "Members ranked among themselves and on the board", cost=_by_members),
    _command("rankd.around", -3, rankd_around, "around", _READ, _KEY, "rankd",
             "A member and its neighbours on the board"),
    _command("rankd.window", -1, rankd_window, None, ("fast",), group="rankd",
             summary="The window (and period) this connection reads"),
]}
# Expiry (rankd.frontends.resp.expiry): a deadline is a deferred deletion,
# so setting one takes the scope changing a board's config takes (admin).
COMMANDS.update({c.name.encode(): c for c in [
    _command("expire", -3, expiry.expire, "patch_board", ("write", "fast"), _KEY, "keyspace",
             "Delete a board after a number of seconds", immediate=False),
    _command("pexpire", -3, expiry.pexpire, "patch_board", ("write", "fast"), _KEY,
             "keyspace", "Delete a board after a number of milliseconds", immediate=False),
    _command("expireat", -3, expiry.expireat, "patch_board", ("write", "fast"), _KEY,
             "keyspace", "Delete a board at a Unix time (seconds)", immediate=False),
    _command("pexpireat", -3, expiry.pexpireat, "patch_board", ("write", "fast"), _KEY,
             "keyspace", "Delete a board at a Unix time (milliseconds)", immediate=False),
    _command("persist", 2, expiry.persist, "patch_board", ("write", "fast"), _KEY, "keyspace",
             "Keep a board: clear its deadline", immediate=False),
    _command("ttl", 2, expiry.ttl, "get_board", _READ, _KEY, "keyspace",
             "Seconds until a board is deleted"),
    _command("pttl", 2, expiry.pttl, "get_board", _READ, _KEY, "keyspace",
             "Milliseconds until a board is deleted"),
    _command("expiretime", 2, expiry.expiretime, "get_board", _READ, _KEY, "keyspace",
             "When a board is deleted, Unix time in seconds"),
    _command("pexpiretime", 2, expiry.pexpiretime, "get_board", _READ, _KEY, "keyspace",
             "When a board is deleted, Unix time in milliseconds"),
]})
# Tooling (issue 45, item 8): rankd.frontends.resp.tooling.
COMMANDS.update({c.name.encode(): c for c in [
    _command("unlink", -2, zset.delete, "delete_board", ("write", "fast"), (1, -1), "keyspace",
             "Delete boards (as DEL: at once)", immediate=False),
    _command("time", 1, tooling.time_, "top", ("loading", "stale", "fast"), group="server",
             summary="The server's time"),
    _container("object", [
        _command("object|encoding", 3, tooling.object_encoding, "top", ("readonly",), (2, 2),
                 "keyspace"),
        _command("object|freq", 3, tooling.object_freq, "top", ("readonly",), (2, 2),
                 "keyspace"),
    ], "keyspace"),
    _container("memory", [
        _command("memory|usage", -3, tooling.memory_usage, "top", ("readonly",), (2, 2),
                 "server"),
    ], "server"),
]})
COMMANDS[b"command"] = Command(
    "command", -1, command_, None, ("loading", "stale"), group="server",
    summary="Every command's details", subcommands={
        b"count": _command("command|count", 2, command_count, None, group="server"),
        b"info": _command("command|info", -2, command_info, None, group="server",
                          cost=_names_cost),
        b"docs": _command("command|docs", -2, command_docs, None, group="server",
                          cost=_names_cost),
        b"list": _command("command|list", -2, command_list, None, group="server"),
        b"getkeys": _command("command|getkeys", -4, command_getkeys, None, group="server"),
    })

# Transactions (rankd.frontends.resp.transactions): MULTI queues, EXEC applies atomically.
COMMANDS.update({c.name.encode(): c for c in [
    _command("multi", 1, transactions.multi, None, ("noscript", "loading", "stale", "fast"),
             group="transactions", summary="Start a transaction"),
    _command("exec", 1, transactions.exec_, None, ("noscript", "loading", "stale"),
             group="transactions", summary="Run the queued commands as one atomic commit",
             immediate=False),
    _command("discard", 1, transactions.discard, None, ("noscript", "loading", "stale", "fast"),
             group="transactions", summary="Forget the queued commands"),
    _command("watch", -2, transactions.watch, None, ("noscript", "loading", "stale", "fast"),
             (1, -1), "transactions", "Abort the next EXEC if these keys change",
             cost=_by_keys),
    _command("unwatch", 1, transactions.unwatch, None, ("noscript", "loading", "stale", "fast"),
             group="transactions", summary="Forget the watched keys"),
]})
# --- aggregations, stores, lex ranges (issue 45 items 3 and 4) -----------------------
_STORE = ("write", "denyoom")
COMMANDS.update({c.name.encode(): c for c in [
    _command("zunion", -3, aggregates.zunion, "top", ("readonly",),
             summary="Union of sorted sets", cost=_by_members, immediate=False),
    _command("zinter", -3, aggregates.zinter, "top", ("readonly",),
             summary="Intersection of sorted sets", cost=_by_members, immediate=False),
    _command("zintercard", -3, aggregates.zintercard, "top", ("readonly",),
             summary="Number of members in the intersection of sorted sets",
             cost=_by_members, immediate=False),
    _command("zdiff", -3, aggregates.zdiff, "top", ("readonly",),
             summary="Difference of sorted sets", cost=_by_members, immediate=False),
    _command("zunionstore", -4, aggregates.zunionstore, "submit", _STORE, _KEY,
             summary="Store the union of sorted sets", cost=_by_members, immediate=False),
    _command("zinterstore", -4, aggregates.zinterstore, "submit", _STORE, _KEY,
             summary="Store the intersection of sorted sets", cost=_by_members,
             immediate=False),
    _command("zdiffstore", -4, aggregates.zdiffstore, "submit", _STORE, _KEY,
             summary="Store the difference of sorted sets", cost=_by_members,
             immediate=False),
    _command("zrangestore", -5, aggregates.zrangestore, "submit", _STORE, (1, 2),
             summary="Store a range of members", immediate=False),
    _command("zrangebylex", -4, zset.zrangebylex, "top", ("readonly",), _KEY,
             summary="Members in a lexicographical range", immediate=False),
    _command("zrevrangebylex", -4, zset.zrevrangebylex, "top", ("readonly",), _KEY,
             summary="Members in a lexicographical range, in reverse", immediate=False),
    _command("zlexcount", 4, zset.zlexcount, "top", _READ, _KEY,
             summary="Members in a lexicographical range"),
    _command("zremrangebylex", 4, zset.zremrangebylex, "remove_member", ("write",), _KEY,
             summary="Remove members in a lexicographical range", immediate=False),
    _command("zrandmember", -2, pops.zrandmember, "top", ("readonly",), _KEY,
             summary="Random members", immediate=False),
    _command("zmpop", -4, pops.zmpop, "remove_member", ("write",),
             summary="Remove and return members from the first non-empty set",
             immediate=False, applied_now=True),
    _command("bzpopmin", -3, pops.bzpopmin, "remove_member", ("write", "blocking"), (1, -2),
             summary="ZPOPMIN, waiting for a member", immediate=False, applied_now=True),
    _command("bzpopmax", -3, pops.bzpopmax, "remove_member", ("write", "blocking"), (1, -2),
             summary="ZPOPMAX, waiting for a member", immediate=False, applied_now=True),
    _command("bzmpop", -5, pops.bzmpop, "remove_member", ("write", "blocking"),
             summary="ZMPOP, waiting for a member", immediate=False, applied_now=True),
]})
# MONITOR (rankd.frontends.resp.monitor): admin only (no scope names it).
COMMANDS[b"monitor"] = _command(
    "monitor", 1, monitor.monitor, "monitor", ("admin", "noscript", "loading", "stale"),
    group="server", summary="Stream every command the server runs")
# Redis Cluster's protocol (rankd.frontends.resp.cluster_commands): on a cluster node.
_CLUSTER = cluster_commands
COMMANDS.update({c.name.encode(): c for c in [
    _container("cluster", [
        _command("cluster|slots", 2, _CLUSTER.cluster_slots, None, ("loading", "stale"),
                 group="cluster"),
        _command("cluster|shards", 2, _CLUSTER.cluster_shards, None, ("loading", "stale"),
                 group="cluster"),
        _command("cluster|nodes", 2, _CLUSTER.cluster_nodes, None, ("loading", "stale"),
                 group="cluster"),
        _command("cluster|info", 2, _CLUSTER.cluster_info, None, ("loading", "stale"),
                 group="cluster"),
        _command("cluster|myid", 2, _CLUSTER.cluster_myid, None, ("loading", "stale"),
                 group="cluster"),
        _command("cluster|keyslot", 3, _CLUSTER.cluster_keyslot, None, ("loading", "stale"),
                 group="cluster"),
        _command("cluster|countkeysinslot", 3, _CLUSTER.cluster_countkeysinslot,
                 "list_boards", ("loading", "stale"), group="cluster"),
        _command("cluster|getkeysinslot", 4, _CLUSTER.cluster_getkeysinslot, "list_boards",
                 ("loading", "stale"), group="cluster"),
    ], "cluster"),
    _command("readonly", 1, _CLUSTER.readonly, None, ("loading", "stale", "fast"),
             group="cluster", summary="Read from this node's copy of any slot it follows"),
    _command("readwrite", 1, _CLUSTER.readwrite, None, ("loading", "stale", "fast"),
             group="cluster", summary="Read only slots this node writes (the default)"),
    _command("asking", 1, _CLUSTER.asking, None, ("fast",), group="cluster",
             summary="Accepted: this client follows redirections"),
]})
