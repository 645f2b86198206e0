"""Who is a node of the cluster, and how nodes prove it to each other.

Every node of a cluster holds the *cluster secret*: ``--cluster-secret``
(or ``--cluster-secret-file``), required once clients need credentials;
on a cluster without credentials, where every client may write anyway, the
first node generates one and keeps it in Postgres (``rankd_cluster_secret``,
:func:`shared_secret`).  With it a node

* signs its row of ``rankd_nodes`` (:meth:`ClusterTrust.node_proof`, over its
  id and addresses): a node takes another as a peer (names it as a group's
  primary, forwards writes to it, gives its address in ``moved`` answers)
  only if that proof holds (:meth:`ClusterTrust.vouches`).  A row that anyone
  else wrote is ignored, and so is a copied proof beside another address;
* signs every write it forwards (:meth:`ClusterTrust.forward_header`): an
  HMAC over its id, the time, a nonce, the method, path and query, the body's
  SHA-256 and the caller the forwarding node admitted.  The client's own
  credential is never passed on.  A node accepts a forward only with a
  valid signature made less than :data:`FORWARD_WINDOW_SECONDS` ago whose
  nonce it has not seen (:meth:`ClusterTrust.verify_forward`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from rankd.cluster.log import lock_schema
from rankd.security.auth import Principal, Unauthorized

log = logging.getLogger(__name__)

#: The shortest cluster secret accepted, in bytes.
MIN_SECRET_BYTES = 32
#: The header that carries a forward's node credential.
FORWARD_AUTH = "X-Rankd-Forward-Auth"
#: How old a forward's signature may be (the nodes' clocks must agree so far).
FORWARD_WINDOW_SECONDS = 60.0
#: Nonces remembered at most (a forward replayed after that many is refused
#: by its age: the window holds fewer at any rate a node forwards).
MAX_NONCES = 200_000

SECRET_SCHEMA = """
CREATE TABLE IF NOT EXISTS rankd_cluster_secret (
    id     int PRIMARY KEY CHECK (id = 1),
    secret bytea NOT NULL
);
"""


@dataclass(frozen=True)
class ForwardedCaller:
    """Who a verified forward is for: the caller the forwarding node admitted."""

    node: str
    principal: Principal
    #: The client's address as the forwarding node saw it (for rate limits).
    address: str


def _mac(secret: bytes, *parts: str) -> str:
    return hmac.new(secret, "\0".join(parts).encode(), hashlib.sha256).hexdigest()


class ClusterTrust:
    """The cluster secret of one node, and what it signs and checks."""

    def __init__(self, secret: bytes | None = None, *,
                 clock: Callable[[], float] = time.time) -> None:
        #: None until the node joined (then its configured or shared secret).
        self.secret = secret
        self.clock = clock
        self._nonces: OrderedDict[str, float] = OrderedDict()

    def _key(self) -> bytes:
        if self.secret is None:
            raise Unauthorized("this node has not joined its cluster yet")
        return self.secret

    # --- nodes --------------------------------------------------------------------------

    def node_proof(self, node: str, advertise: str, advertise_tcp: str | None,
                   advertise_resp: str | None = None) -> str:
        """The proof a node writes beside its row of ``rankd_nodes`` (its RESP
        address signed too when it has one: cluster clients are sent there)."""
        resp = (advertise_resp,) if advertise_resp else ()
        return _mac(self._key(), "rankd-node-v1", node, advertise, advertise_tcp or "", *resp)

    def vouches(self, node: str, advertise: str, advertise_tcp: str | None,
                proof: str | None, advertise_resp: str | None = None) -> bool:
        """Whether a node row was written by a node holding the cluster secret."""
        return proof is not None and self.secret is not None and hmac.compare_digest(
            proof, self.node_proof(node, advertise, advertise_tcp, advertise_resp))

    # --- forwards -----------------------------------------------------------------------

    def forward_header(self, node: str, method: str, path_qs: str, body: bytes,
                       principal: Principal, address: str) -> str:
        """The :data:`FORWARD_AUTH` value of a forward by ``node``."""
        caller = base64.urlsafe_b64encode(json.dumps(
            {"name": principal.name, "scopes": sorted(principal.scopes),
             "subject": principal.subject, "address": address},
            separators=(",", ":")).encode()).decode()
        stamp, nonce = f"{self.clock():.3f}", secrets.token_hex(16)
        signature = _mac(self._key(), "rankd-forward-v1", node, stamp, nonce, method, path_qs,
                         caller, hashlib.sha256(body).hexdigest())
        return f"v1 ts={stamp} nonce={nonce} caller={caller} sig={signature}"

    def verify_forward(self, node: str, header: str | None, method: str, path_qs: str,
                       body: bytes) -> ForwardedCaller:
        """The caller of a forward from ``node``; :class:`Unauthorized` unless
        its node credential is valid, recent and not seen before."""
        fields = dict(part.split("=", 1) for part in (header or "").split()[1:]
                      if "=" in part)
        if (not header or not header.startswith("v1 ")
                or not {"ts", "nonce", "caller", "sig"} <= fields.keys()):
            raise Unauthorized(f"a forwarded request needs a node credential "
                               f"({FORWARD_AUTH}); a client's is not accepted")
        expected = _mac(self._key(), "rankd-forward-v1", node, fields["ts"], fields["nonce"],
                        method, path_qs, fields["caller"], hashlib.sha256(body).hexdigest())
        if not hmac.compare_digest(expected, fields["sig"]):
            raise Unauthorized("the forward's node credential is not valid")
        try:
            age = self.clock() - float(fields["ts"])
            caller = json.loads(base64.urlsafe_b64decode(fields["caller"]))
            principal = Principal(str(caller["name"]), frozenset(caller["scopes"]),
                                  caller["subject"])
            address = str(caller["address"])
        except (ValueError, KeyError, TypeError) as exc:
            raise Unauthorized(f"the forward's node credential is malformed ({exc})") from None
        if abs(age) > FORWARD_WINDOW_SECONDS:
            raise Unauthorized(f"the forward's node credential is {age:.0f} s old (at most "
                               f"{FORWARD_WINDOW_SECONDS:g}: are the nodes' clocks set?)")
        self._remember(fields["nonce"])
        return ForwardedCaller(node, principal, address)

    def _remember(self, nonce: str) -> None:
        now = time.monotonic()
        while self._nonces and (len(self._nonces) >= MAX_NONCES or next(
                iter(self._nonces.values())) < now - 2 * FORWARD_WINDOW_SECONDS):
            self._nonces.popitem(last=False)
        if nonce in self._nonces:
            raise Unauthorized("the forward was replayed (its nonce was seen already)")
        self._nonces[nonce] = now


async def shared_secret(conn: asyncpg.Connection) -> bytes:
    """The secret of a cluster without one configured: made by its first
    node, kept in Postgres (so its trust is that of Postgres's access)."""
    async with conn.transaction():
        await lock_schema(conn)
        await conn.execute(SECRET_SCHEMA)
        await conn.execute("INSERT INTO rankd_cluster_secret (id, secret) VALUES (1, $1) "
                           "ON CONFLICT DO NOTHING", secrets.token_bytes(32))
    return bytes(await conn.fetchval("SELECT secret FROM rankd_cluster_secret WHERE id = 1"))
