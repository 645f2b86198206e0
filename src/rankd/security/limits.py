"""Token-bucket rate limits, per credential and per client address.

Reads and writes have separate buckets.  A bucket holds up to ``burst``
tokens and refills at ``rate`` per second; each operation (each event of a
batch) takes one.  When a bucket is empty the caller is told how long until
enough tokens are back (``Retry-After``).

A request that costs more than the burst (a large batch, a long pipelined
run) is charged in full: it passes only on a full bucket, which it leaves
in debt, and later requests wait until the debt is paid back.  So a limit
holds whatever the size of the requests, and a ``Retry-After`` is exact:
the same request passes once it has passed.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from rankd.engine.errors import EngineError

MAX_TRACKED = 100_000


class RateLimited(EngineError):
    """Over a rate limit (HTTP 429)."""

    code = "rate_limited"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class _Bucket:
    tokens: float
    updated: float


class TokenBuckets:
    """One bucket per key, created full; the least recently used are forgotten."""

    def __init__(self, rate: float, burst: float, clock=time.monotonic) -> None:
        self.rate = rate
        self.burst = max(burst, 1.0)
        self.clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def take(self, key: str, cost: float = 1.0) -> float:
        """Take ``cost`` tokens; 0 if allowed, else seconds until it would be
        (the bucket may go below zero: see the module's docstring)."""
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(self.burst, now)
            if len(self._buckets) > MAX_TRACKED:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
        needed = min(cost, self.burst)
        if bucket.tokens >= needed:
            bucket.tokens -= cost
            return 0.0
        return (needed - bucket.tokens) / self.rate


@dataclass
class LimitsConfig:
    """Rates per second (0: unlimited) and bursts."""

    address_writes: float = 2000.0
    address_reads: float = 5000.0
    credential_writes: float = 0.0
    credential_reads: float = 0.0
    #: Loopback clients (same machine) are trusted with unlimited rates.
    exempt_loopback: bool = True


@functools.lru_cache(maxsize=4096)
def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return address in ("", "localhost") or address.startswith("/")  # unix sockets


class RateLimiter:
    """Checks an operation against the address and credential buckets."""

    def __init__(self, config: LimitsConfig) -> None:
        self.config = config
        self._buckets: dict[tuple[str, str], TokenBuckets] = {}
        for who, rates in (("address", (config.address_reads, config.address_writes)),
                           ("credential", (config.credential_reads, config.credential_writes))):
            for kind, rate in zip(("read", "write"), rates, strict=True):
                if rate > 0:
                    self._buckets[(who, kind)] = TokenBuckets(rate, 2 * rate)

    def charger(self, kind: str, address: str, credential: str
                ) -> Callable[[int], None] | None:
        """:meth:`check` for this address and credential as a function of the
        cost; None if neither has a bucket (unlimited, or exempt)."""
        if any(self._limited(who, kind, key)
               for who, key in (("address", address), ("credential", credential))):
            return functools.partial(self.check, kind, address, credential)
        return None

    def _limited(self, who: str, kind: str, key: str) -> bool:
        if (who, kind) not in self._buckets:
            return False
        if who == "address":
            return not (self.config.exempt_loopback and is_loopback(key))
        return key != "anonymous"

    def check_address(self, kind: str, address: str, cost: int = 1) -> None:
        """:meth:`check` of the address bucket alone: charged before the
        caller is known, so requests with bad credentials are limited too."""
        self._check_one("address", kind, address, cost)

    def check_credential(self, kind: str, credential: str, cost: int = 1) -> None:
        """:meth:`check` of the credential bucket alone."""
        self._check_one("credential", kind, credential, cost)

    def check(self, kind: str, address: str, credential: str, cost: int = 1) -> None:
        """Raise :class:`RateLimited` when over a limit (``kind``: read or write).
        A ``cost`` of 0 checks nothing: the caller charges the real cost once
        it knows it (a batch, once its body is read), and only that check's
        ``Retry-After`` is one the request can keep."""
        self._check_one("address", kind, address, cost)
        self._check_one("credential", kind, credential, cost)

    def _check_one(self, who: str, kind: str, key: str, cost: int) -> None:
        if cost <= 0 or not self._limited(who, kind, key):
            return
        buckets = self._buckets[(who, kind)]
        wait = buckets.take(key, cost)
        if wait:
            raise RateLimited(f"too many {kind}s from this {who}; retry in "
                              f"{math.ceil(wait)} s", wait)
