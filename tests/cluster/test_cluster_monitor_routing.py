"""MONITOR on a cluster node shows the commands the node runs, not those it
redirects: a write answered ``-MOVED`` is not shown, whether the node's
view named its node at once or only after reading the group's register
(a group another node took since this node last read the registers)."""

from __future__ import annotations

import socket
import time

from cluster_nodes import keys_guessed_by, nodes, sql

from rankd.engine.groups import group_of
from respclient import RawClient


def _shown(monitor: socket.socket) -> list[str]:
    """The commands a MONITOR connection showed so far (their lines)."""
    monitor.settimeout(1.0)
    data = b""
    try:
        while chunk := monitor.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    return [line for line in data.decode().splitlines() if line.startswith("+") and '"' in line]


def test_a_write_moved_after_learning_is_not_shown(tmp_path, pg_server) -> None:
    dsn = pg_server.create_database()
    with nodes(tmp_path, dsn, 2) as (node, other):
        keys = keys_guessed_by(node.resp_port, other.resp_port, "shown-", 4)
        monitor = socket.create_connection(("127.0.0.1", node.resp_port))
        monitor.sendall(b"MONITOR\r\n")
        time.sleep(0.3)
        monitor.recv(100)  # +OK
        with RawClient(node.resp_port) as client:
            client.call("CLUSTER", "SLOTS")  # a cluster client: answered -MOVED
            # The other node holds these groups now (as a take there would
            # leave the registers); this node's view has not read it yet.
            sql(dsn, "INSERT INTO rankd_groups (group_id, epoch, last_seq, holder, lease_until) "
                     "SELECT g, 1, 0, 'n1', now() + interval '30 seconds' FROM unnest($1::int[]) g",
                [group_of(key) for key in keys])
            replies = client.pipeline([["ZADD", key, "1", "m"] for key in keys] + [["PING"]])
        assert all(reply.startswith(b"-MOVED ") for reply in replies[:-1]), replies
        shown = _shown(monitor)
        monitor.close()
        assert [line.split('"')[1] for line in shown] == ["CLUSTER", "PING"], shown


def test_a_blocking_pop_of_a_fresh_group_is_shown_as_it_waits(tmp_path, pg_server) -> None:
    dsn = pg_server.create_database()
    with nodes(tmp_path, dsn, 2) as (node, other):
        (key,) = keys_guessed_by(node.resp_port, other.resp_port, "waits-", 1)
        monitor = socket.create_connection(("127.0.0.1", node.resp_port))
        monitor.sendall(b"MONITOR\r\n")
        time.sleep(0.3)
        monitor.recv(100)  # +OK
        with RawClient(node.resp_port, timeout=10) as client:
            client.send(b"*3\r\n$8\r\nBZPOPMIN\r\n$%d\r\n%s\r\n$1\r\n3\r\n" % (
                len(key), key.encode()))
            shown = _shown(monitor)  # (a second: the pop still waits)
            assert client.reply() == b"*-1\r\n"
        monitor.close()
        assert [line.split('"')[1] for line in shown] == ["BZPOPMIN"], shown
