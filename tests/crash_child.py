"""Child process for the crash test: submit events until killed.

Usage: crash_child.py DATA_DIR CYCLE FSYNC

Opens the engine on DATA_DIR and runs 64 concurrent submitters on the
``crash`` board (policy sum): each event ``c<CYCLE>-<n>`` adds 1 to its own
member, so after any number of crashes an acknowledged event must show as
a score of exactly 1.  Each acknowledgement is printed (and flushed) as
``ACK <event_id>`` only after the engine acknowledged it.  Every cycle also
resubmits events of the previous cycle, which must come back as duplicates.
"""

import asyncio
import sys

from rankd.engine.engine import Engine, EngineConfig
from rankd.engine.submission import Submission


async def main(data_dir: str, cycle: int, fsync: str) -> None:
    engine = await Engine.open(
        EngineConfig(data_dir=data_dir, fsync=fsync, snapshot_every_events=3000)
    )
    if "crash" not in engine.boards:
        await engine.put_board("crash", {"policy": "sum"})
    print("READY", flush=True)
    counter = iter(range(10**9))

    async def submitter() -> None:
        while True:
            n = next(counter)
            resend = n % 10 == 0 and cycle > 0
            event_id = f"c{cycle - 1}-{n // 10}" if resend else f"c{cycle}-{n}"
            result = await engine.submit(
                Submission(board="crash", member=event_id, delta=1, event_id=event_id)
            )
            print("ACK", event_id, int(result["duplicate"]), flush=True)

    await asyncio.gather(*(submitter() for _ in range(64)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
