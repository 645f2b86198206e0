"""Adapt a fetched Redis ``tests/`` tree to run against rankd's RESP port.

Usage: ``python patch.py TREE`` (TREE holds ``runtest`` and ``tests/``).
Idempotent.  Every difference from Redis's own harness is here:

* harness calls rankd refuses by design are wrapped in ``catch``: the
  ``FUNCTION FLUSH`` every ``start_server`` sends (rankd has no scripting),
  its ``CONFIG SET`` of a server's overrides and the test files' ``CONFIG
  SET`` of encodings (``zset-max-*``: rankd has one representation, and
  takes its settings at start);
* after a test that fails (a command rankd lacks, an assertion) the main
  client connects again and is set as it was before the test (``readraw``,
  a setting of the Tcl client, and the RESP version), so the next tests do
  not queue their commands in a ``MULTI`` nobody executes, read replies a
  deferred client left unread, or read raw or in RESP3: Redis's tests put
  these back only at their end (:data:`RESTORE`);
* the deferring clients a failed test opened are closed (:data:`DEFERRING`):
  one left blocked in a ``BZPOPMIN ... 0`` would take the member the next
  test's client waits for, and that test would wait for ever;
* :data:`REFUSED_BY_DESIGN` names the tests that need behaviour rankd
  refuses by design (docs/redis.md "What rankd refuses by design"): they
  are written to ``rankd-skip.txt`` for ``runtest --skipfile`` and so
  counted as skipped, one by one, rather than failed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: Test names (exact, or a regexp when they start with ``/``, as
#: ``--skiptest`` takes them), each with why rankd refuses what it needs.
REFUSED_BY_DESIGN: dict[str, str] = {
    # Infinite scores (docs/redis.md: REST and JSON have no infinity).
    "/^ZADD INCR LT/GT with inf - ": "infinite scores",
    "/^ZINCRBY calls leading to NaN result in error - ": "infinite scores (+inf plus -inf)",
    "/^ZRANGEBYSCORE/ZREVRANGEBYSCORE/ZCOUNT basics - ":
        "infinite scores (its set holds -inf and +inf)",
    "/^ZRANGEBYSCORE with (WITHSCORES|LIMIT|LIMIT and WITHSCORES) - ":
        "infinite scores (the same set)",
    "/^(ZUNIONSTORE|ZINTERSTORE) with [+]inf/-inf scores - ": "infinite scores",
    "ZUNIONSTORE regression, should not create NaN in scores": "infinite scores (-inf)",
    # Members are UTF-8 text (docs/redis.md): the fuzzer draws binary ones.
    "/^ZDIFF fuzzing - ": "members that are not UTF-8 text",
    # Empty members: a member is a REST path segment, which cannot be empty.
    "/^(ZRANGEBYLEX|ZREMRANGEBYLEX) fuzzy test": "empty members (random members include \"\")",
}


#: Put into ``proc test`` (support/test.tcl) around the run of a test's body.
RUN = "    if {[catch {set retval [uplevel 1 $code]} error]} {\n"
RESTORE = (
    "    set rankd_raw 0\n"
    "    catch {set rankd_raw [r readingraw]}\n"
    "    set rankd_proto $::rankd_proto\n"
    "    set ::rankd_deferring {}\n"
    + RUN +
    # What restores the client below must not replace the failure's own
    # ``errorInfo``, which the report shows.
    "        set rankd_info $::errorInfo\n"
    # A new connection (the Tcl client opens one on its next command once
    # its socket is {}): no MULTI left open, no reply left unread by a
    # deferred client (``populate`` stops at its first error), RESP2.
    "        catch {\n"
    "            set rankd_id [string range [srv 0 client]"
    " [string length ::redis::redisHandle] end]\n"
    "            catch {close $::redis::fd($rankd_id)}\n"
    "            set ::redis::fd($rankd_id) {}\n"
    "            set ::redis::deferred($rankd_id) 0\n"
    "        }\n"
    "        catch {r readraw $rankd_raw}\n"
    "        set ::rankd_proto $rankd_proto\n"
    "        catch {r hello $rankd_proto}\n"
    "        foreach rankd_client $::rankd_deferring {catch {$rankd_client close}}\n"
    "        set ::errorInfo $rankd_info\n"
)
#: ``proc r`` (test_helper.tcl) notes the RESP version the main client's
#: ``HELLO`` asked for, which RESTORE puts back.
R_PROC = "proc r {args} {\n    set level 0\n"
R_NOTES = ("set ::rankd_proto 2\nset ::rankd_deferring {}\nproc r {args} {\n"
           "    if {[string equal -nocase [lindex $args 0] hello] && [llength $args] > 1} {\n"
           "        set ::rankd_proto [lindex $args 1]\n    }\n    set level 0\n")

#: ``redis_deferring_client`` (test_helper.tcl) notes each client it makes,
#: which RESTORE closes after a failed test.
DEFERRING = "    set client [redis [srv $level \"host\"] [srv $level \"port\"] 1 $::tls]\n"
DEFERRING_NOTED = DEFERRING + "    lappend ::rankd_deferring $client\n"


def wrap(path: Path, pattern: str) -> None:
    """Wrap each line matching ``pattern`` (a whole ``r ...`` command) in catch."""
    text = path.read_text()
    lines = []
    for line in text.split("\n"):
        stripped = line.strip()
        if re.fullmatch(pattern, stripped) and not stripped.startswith("catch"):
            line = line[:len(line) - len(line.lstrip())] + "catch {" + stripped + "}"
        lines.append(line)
    path.write_text("\n".join(lines))


def main(tree: Path) -> None:
    tests = tree / "tests"
    wrap(tests / "support" / "server.tcl", r"r (function flush|config set \$param \$val)")
    test_tcl = tests / "support" / "test.tcl"
    text = test_tcl.read_text()
    if "rankd_raw" not in text:
        assert RUN in text, "support/test.tcl: proc test is not as expected"
        test_tcl.write_text(text.replace(RUN, RESTORE, 1))
    helper = tests / "test_helper.tcl"
    text = helper.read_text()
    if "rankd_proto" not in text:
        assert R_PROC in text, "test_helper.tcl: proc r is not as expected"
        assert DEFERRING in text, "test_helper.tcl: redis_deferring_client is not as expected"
        helper.write_text(text.replace(R_PROC, R_NOTES, 1).replace(DEFERRING, DEFERRING_NOTED, 1))
    for unit in (tests / "unit").rglob("*.tcl"):
        wrap(unit, r"r config set zset-\S+ \S+")
    (tree / "rankd-skip.txt").write_text("\n".join(REFUSED_BY_DESIGN) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
