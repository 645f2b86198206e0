"""Small boards retiring periods: the shared name arena's records and CPU.

Fifty boards of ``all`` and ``daily`` (paged indexes sharing one
:class:`rankd._pages.Names` each), 200 members new to each board a day,
written to both windows; each day's members leave ``all`` two days later
and the daily index is retired after three.  Every arena stays below the
size the compaction of free records starts at (32 KiB), so the records of
retired periods are reclaimed only by the compaction that the dead
estimate starts.  Prints the arenas' bytes and records against the live
members, and the CPU time per write.  Run it on each tree, alternated::

    PYTHONPATH=src python bench/bench_retired_names.py
"""

from __future__ import annotations

import time

from rankd._pages import Names, RankIndex

BOARDS, DAYS, PER_DAY = 50, 60, 200


def main() -> None:
    """Run the scenario once and print its figures."""
    boards = []
    for _ in range(BOARDS):
        arena = Names()
        boards.append((arena, RankIndex(names=arena), {}))
    started = time.process_time()
    writes = 0
    for day in range(DAYS):
        for arena, everyone, days in boards:
            daily = days[day] = RankIndex(names=arena)
            for i in range(PER_DAY):
                member = f"d{day}-{i}"
                everyone.set(member, float(i))
                daily.set(member, float(i))
                writes += 2
                if day >= 2:
                    everyone.remove(f"d{day - 2}-{i}")
                    writes += 1
            days.pop(day - 3, None)  # retired
    cpu_ns = (time.process_time() - started) / writes * 1e9
    live = sum(len({m for index in [everyone, *days.values()] for m, _ in index})
               for _, everyone, days in boards)
    units = sum(arena._state()[1] for arena, _, _ in boards)
    records = sum(arena._state()[0] for arena, _, _ in boards)
    print(f"arena bytes {units * 4}, records {records}, live members {live}, "
          f"cpu ns/write {cpu_ns:.0f}")


if __name__ == "__main__":
    main()
