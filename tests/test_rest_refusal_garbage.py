"""A refused write leaves no cyclic garbage behind (issue 49).

A write a cluster node refuses (``NotPrimary``: answered 421, or forwarded
to the group's primary) raised through the request's frames; the
exception's traceback held those frames, and they it, so each such request
left about 44 objects in cycles that only the collector freed: a
collection every 50,000 allocations then freed a thousand requests at
once, holding the loop 30-170 ms on a node forwarding a moving group's
writes.  The front door drops the traceback once it answered.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from engine_helpers import engine_config
from rankd.engine.engine import Engine
from rankd.engine.errors import NotPrimary
from rankd.engine.submission import Submission
from rankd.frontends import rest
from rankd.frontends.service import Service

REQUESTS = 50


def test_a_refused_write_leaves_no_cycles(tmp_path: Path) -> None:
    async def run() -> int:
        engine = await Engine.open(engine_config(tmp_path))
        await engine.put_board("b", {"policy": "best"})

        async def refuse(submissions: list[object]) -> list[NotPrimary]:
            # What a cluster node's batch answers a write of a group it
            # does not write (the engine raises it from its own frame).
            return [NotPrimary("node n1 writes this board's group") for _ in submissions]

        engine.coalescer.submit_many = refuse  # type: ignore[method-assign]
        app = rest.create_app(Service(engine))
        app[rest.DOOR].submitters = None  # the general way, where it raised
        client = TestClient(TestServer(app))
        await client.start_server()
        try:
            for n in range(3):  # warm: first requests build lasting state
                await client.post("/v1/boards/b/scores", json={"member": f"m{n}", "score": 1})
            gc.collect()
            gc.disable()
            try:
                for n in range(REQUESTS):
                    answer = await client.post("/v1/boards/b/scores",
                                               json={"member": f"m{n}", "score": 1})
                    assert answer.status == 421, await answer.text()
                    assert (await answer.json())["error"]["code"] == "not_primary"
                return gc.collect()
            finally:
                gc.enable()
        finally:
            await client.close()
            await engine.close()

    found = asyncio.run(run())
    assert found < REQUESTS, f"{found} objects in cycles after {REQUESTS} refused writes"


def test_the_engine_raises_a_refusal_without_a_cycle(tmp_path: Path) -> None:
    """The same at its source, for every caller of ``Engine.submit``."""
    async def run() -> int:
        engine = await Engine.open(engine_config(tmp_path))
        try:
            async def refuse(submissions: list[object]) -> list[NotPrimary]:
                return [NotPrimary("node n1 writes this board's group") for _ in submissions]

            engine.coalescer.submit_many = refuse  # type: ignore[method-assign]
            gc.collect()
            gc.disable()
            try:
                for n in range(REQUESTS):
                    try:
                        await engine.submit(Submission("b", f"m{n}", 1.0))
                    except NotPrimary:
                        pass
                    else:
                        raise AssertionError("the refusal was not raised")
                return gc.collect()
            finally:
                gc.enable()
        finally:
            await engine.close()

    found = asyncio.run(run())
    assert found < REQUESTS, f"{found} objects in cycles after {REQUESTS} refusals"
