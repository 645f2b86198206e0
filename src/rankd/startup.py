"""Start-up failures as one line that blames the right thing.

A listener that cannot bind names itself and the flag that sets its port;
a Postgres that cannot be used names the database, the host and what to do
(start Postgres, fix the host name, create the role or the database),
instead of ``cannot listen on 127.0.0.1: Connection refused`` or a
traceback.
"""

from __future__ import annotations

import errno
import socket
import urllib.parse
from collections.abc import Awaitable
from typing import TypeVar

import asyncpg

T = TypeVar("T")

#: What a connection attempt, never a local disk, fails with.
_NETWORK_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.EHOSTUNREACH,
                   errno.ENETUNREACH, errno.ETIMEDOUT, errno.EHOSTDOWN}


class StartupError(RuntimeError):
    """The daemon cannot start; the message says what failed and what to do."""


async def listening(what: str, flag: str, host: str, port: int, start: Awaitable[T]) -> T:
    """Await ``start`` (a listener opening on ``host:port``); a bind that
    fails raises :class:`StartupError` naming the listener and ``flag``."""
    try:
        return await start
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE or "in use" in reason:
            advice = f"another process listens there: stop it, or give {flag} another port"
        elif exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
            advice = f"{host} is not an address of this machine: check --host"
        elif exc.errno == errno.EACCES:
            advice = f"ports below 1024 need privileges: give {flag} a port above 1023"
        else:
            advice = f"check --host and {flag}"
        raise StartupError(f"cannot listen for {what} on {host}:{port} ({flag}): {reason}; "
                           f"{advice}") from None


def _is_postgres_failure(exc: BaseException) -> bool:
    if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError | TimeoutError
                  | socket.gaierror | ConnectionError):
        return True
    # A host with several addresses (localhost) fails with one OSError
    # listing each attempt's, and no errno of its own.
    return isinstance(exc, OSError) and (exc.errno in _NETWORK_ERRNOS
                                         or str(exc).startswith("Multiple exceptions"))


def describe_dsn(dsn: str) -> tuple[str, str, str]:
    """The database, ``host:port`` and role a DSN names (never its password)."""
    parts = urllib.parse.urlsplit(dsn)
    query = urllib.parse.parse_qs(parts.query)
    user = parts.username or query.get("user", [""])[0] or "(your login name)"
    database = parts.path.lstrip("/") or query.get("dbname", [""])[0] or user
    host = parts.hostname or query.get("host", ["localhost"])[0]
    try:
        port = parts.port or query.get("port", ["5432"])[0]
    except ValueError:
        port = "?"
    return urllib.parse.unquote(database), f"{host}:{port}", urllib.parse.unquote(user)


def postgres_failure(flag: str, dsn: str, exc: BaseException) -> StartupError:
    """One line for ``exc``, raised using ``dsn`` (given as ``flag``)."""
    database, address, user = describe_dsn(dsn)
    where = f"database {database!r} on {address} ({flag})"
    if isinstance(exc, socket.gaierror):
        host = address.rpartition(":")[0]
        what = (f"the host name {host!r} does not resolve ({exc.strerror or exc}); fix the "
                f"host in {flag}")
    elif isinstance(exc, asyncpg.InvalidCatalogNameError):
        what = (f"it does not exist; create it first: createdb -O {user} {database} "
                "(docs/cluster.md)")
    elif isinstance(exc, asyncpg.InvalidPasswordError):
        what = f"Postgres refused the password of role {user!r}; fix it in {flag}"
    elif isinstance(exc, asyncpg.InvalidAuthorizationSpecificationError):
        what = (f"Postgres refused role {user!r} ({exc}); create it first: "
                f"createuser {user}, or allow it in pg_hba.conf")
    elif isinstance(exc, asyncpg.PostgresError):
        what = f"Postgres answered: {exc}"
    elif isinstance(exc, TimeoutError):
        what = f"no answer from {address}: is Postgres running there, and reachable?"
    else:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        what = f"{reason}: is Postgres running on {address}?"
    # One line, even for a Postgres error with DETAIL and HINT lines.
    return StartupError(" ".join(f"cannot use the Postgres {where}: {what}".split()))


async def reaching_postgres(flag: str, dsn: str, start: Awaitable[T]) -> T:
    """Await ``start`` (something that connects to ``dsn`` first); a
    connection or a database that fails raises :class:`StartupError`."""
    try:
        return await start
    except BaseException as exc:
        if not _is_postgres_failure(exc):
            raise
        raise postgres_failure(flag, dsn, exc) from None
