"""How much of the GIL a group load's native steps leave to the event loop.

A node taking a board group (a move's target) loads the group's rank
indexes and event ids in a worker thread (``engine/group_load.py``); the
event loop's thread takes the GIL again for each of uvloop's callbacks.
Here: a rank index of ``--members`` members (default 1,000,000) dumped,
of the kind ``--kind`` names (``skiplist``, the default, or ``pages``;
``--pages`` is ``--kind pages``), and an event-id store of as many entries
as one chunk; each loaded ``--rounds`` times (default 3) in a worker
thread while the main thread lets go of the GIL and takes it again
(``time.sleep(0)``) over and over.  Per load: its wall time, how many
round trips the main thread made, the share of them that waited (took
over 0.1 ms more than an idle one), their median, and the longest wait
(the longest gap between two round trips: a load holding the GIL may make
the main thread wait between them, not only inside one).  In-process: no
daemon, no Postgres.  ``--no-ids`` leaves the event-id store out.

Compare two checkouts side by side (alternated)::

    PYTHONPATH=src python bench/bench_load_gil.py --pages
    PYTHONPATH=/other/checkout/src python bench/bench_load_gil.py --pages
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

from rankd.engine._idstore import FingerprintLog

from rankd.index.kinds import INDEX_KINDS, index_class

#: A round trip this much over an idle one waited for the GIL.
WAITED = 0.0001


def round_trips(name: str, load: Callable[[], object]) -> None:
    """Run ``load`` in a worker thread; print the main thread's GIL round trips."""
    idle = []
    for _ in range(200):
        began = time.perf_counter()
        time.sleep(0)
        idle.append(time.perf_counter() - began)
    usual = statistics.median(idle)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (load(), done.set()))
    trips = []
    longest = 0.0
    started = last = time.perf_counter()
    worker.start()
    while not done.is_set():
        began = time.perf_counter()
        time.sleep(0)
        ended = time.perf_counter()
        trips.append(ended - began)
        longest = max(longest, ended - last)
        last = ended
    worker.join()
    waited = sum(trip > usual + WAITED for trip in trips) / len(trips)
    print(f"  {name}: {time.perf_counter() - started:.3f} s; {len(trips)} round trips "
          f"(idle {usual * 1e3:.3f} ms), {waited:.0%} waited; median "
          f"{statistics.median(trips) * 1e3:.3f} ms, longest wait {longest * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kind", choices=INDEX_KINDS, default=INDEX_KINDS[0])
    parser.add_argument("--pages", dest="kind", action="store_const", const="pages",
                        help="the paged index (--kind pages)")
    parser.add_argument("--no-ids", dest="ids", action="store_false",
                        help="leave the event-id store out")
    args = parser.parse_args()
    cls = index_class(args.kind)
    index = cls("desc")
    ids = FingerprintLog()
    for n in range(args.members):
        index.set(f"member-{n}", float(n % 1000))
        if args.ids:
            ids.put(f"event-{n}", 1e12, f"member-{n}", n, (float(n % 1000), n, None, True))
    dump = index.dump()
    chunk = b"".join(ids.log_chunks(1 << 30))
    print(f"{args.kind} index of {args.members:,} members ({cls.__module__})")
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}:")
        round_trips(f"{args.kind} index load", lambda: cls.load(dump))
        if args.ids:
            round_trips("event-id load", lambda: FingerprintLog().load_log(chunk))


if __name__ == "__main__":
    main()
