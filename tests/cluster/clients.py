"""The fault harness's clients besides the load's writers, each recording
into a :class:`~history.History` until its ``running()`` says stop:

* :func:`probe_writer`: one sequential writer per probe member (``delta: 1``,
  the next write only once the last one is acknowledged, every attempt of
  a write with the same event id), so that member's score ``v`` means
  exactly its writes 1..v;
* :func:`prober`: open-loop member reads of the probe members through
  every node, each recorded with its node, times, score and board version;
* :func:`live_watcher`: one WebSocket live-feed subscriber per node and
  board, recording every ``leaderboard.updated`` message.

Every link goes through the node's client proxy (``nodes.url``), so a
scenario that cuts clients off a node cuts these off too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable
from typing import Protocol

import aiohttp
from history import History, LiveMessage, Operation, Read

#: Answers that mean "not applied", whatever happened before.
REFUSED_CODES = {"not_primary", "unavailable", "read_only", "invalid", "guard", "not_found",
                 "rate_limited"}
#: The live feed's top-N: above the members any board of the harness has.
LIVE_LIMIT = 100


class Nodes(Protocol):
    """What the clients need of the lab."""

    def url(self, node: int) -> str: ...

    def incarnation(self, node: int) -> int: ...

    @property
    def count(self) -> int: ...


async def submit(session: aiohttp.ClientSession, url: str, op: Operation) -> None:
    """Send ``op`` through ``url``; set its outcome: ok, fail (refused) or unknown."""
    body = {"member": op.member, "delta": 1, "event_id": op.event_id}
    try:
        async with session.post(f"{url}/v1/boards/{op.board}/scores", json=body) as answer:
            payload = await answer.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        op.outcome, op.detail = "unknown", type(exc).__name__
        return
    if answer.status == 200:
        op.outcome, op.detail = "ok", "duplicate" if payload.get("duplicate") else ""
        op.epoch = acknowledged_epoch(payload)
        return
    code = (payload or {}).get("error", {}).get("code", str(answer.status))
    op.outcome = "fail" if code in REFUSED_CODES else "unknown"
    op.detail = code


def acknowledged_epoch(answer: object) -> int | None:
    """The group epoch a write's answer names (None if it names none)."""
    epoch = answer.get("epoch") if isinstance(answer, dict) else None
    return epoch if type(epoch) is int else None


async def probe_writer(nodes: Nodes, history: History, board: str, member: str,
                       running: Callable[[], bool], *, seed: int = 0,
                       timeout: float = 5.0) -> None:
    """Write ``member`` of ``board`` sequentially through random nodes; every
    attempt (an unknown or refused one is retried with the same event id)
    is an operation of the history."""
    rng = random.Random(f"{seed}-{member}")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        number = 0
        while running():
            number += 1
            while running():
                op = Operation(f"{member}-{number}", board, member, rng.randrange(nodes.count),
                               time.monotonic(), number=number)
                history.operations.append(op)
                await submit(session, nodes.url(op.node), op)
                op.completed = time.monotonic()
                if op.outcome == "ok":
                    break
                await asyncio.sleep(0.05)


async def read_member(session: aiohttp.ClientSession, nodes: Nodes, node: int, board: str,
                      member: str, history: History) -> None:
    """One member read through ``node``, recorded in ``history.reads``."""
    read = Read(node, nodes.incarnation(node), board, member, time.monotonic())
    history.reads.append(read)
    try:
        async with session.get(f"{nodes.url(node)}/v1/boards/{board}/members/{member}") as answer:
            payload = await answer.json(content_type=None) or {}
        read.status = answer.status
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
        return
    finally:
        read.completed = time.monotonic()
    if answer.status == 200:
        read.score, read.version = float(payload["score"]), payload.get("version")
        return
    error = payload.get("error", {})
    read.code = error.get("code", "")
    if answer.status == 404 and "no member" in error.get("message", ""):
        read.score = 0.0  # the board is there, the member has no score yet


async def prober(nodes: Nodes, history: History, members: list[tuple[str, str]],
                 running: Callable[[], bool], *, interval: float = 0.05,
                 in_flight: int = 4, timeout: float = 2.0, seed: int = 0) -> None:
    """Open-loop reads: every ``interval`` per node, a read of a random
    ``(board, member)`` is sent whatever the earlier ones are doing (at most
    ``in_flight`` at once per node, so a paused node does not pile them up)."""
    rng = random.Random(seed)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:

        async def drive(node: int) -> None:
            pending: set[asyncio.Task] = set()
            while running():
                if len(pending) < in_flight:
                    board, member = rng.choice(members)
                    task = asyncio.create_task(read_member(session, nodes, node, board,
                                                           member, history))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                await asyncio.sleep(interval)
            if pending:
                await asyncio.wait(pending)

        await asyncio.gather(*(drive(node) for node in range(nodes.count)))


async def live_watcher(nodes: Nodes, history: History, node: int, board: str,
                       running: Callable[[], bool]) -> None:
    """Subscribe to ``board``'s live feed on ``node`` (again whenever the
    connection breaks) and record its ``leaderboard.updated`` messages."""
    timeout = aiohttp.ClientTimeout(total=None, connect=2, sock_connect=2)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while running():
            incarnation = nodes.incarnation(node)
            url = f"{nodes.url(node)}/v1/boards/{board}/live?limit={LIVE_LIMIT}"
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with session.ws_connect(url) as socket:
                    while running():
                        try:
                            message = await socket.receive(timeout=0.5)
                        except TimeoutError:
                            continue
                        if message.type != aiohttp.WSMsgType.TEXT:
                            break
                        data = json.loads(message.data)
                        if data.get("type") == "leaderboard.updated":
                            history.live.append(LiveMessage(
                                node, incarnation, board, time.monotonic(), data["version"],
                                tuple((e["member"], e["score"]) for e in data["top"])))
            await asyncio.sleep(0.2)
