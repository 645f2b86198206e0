"""Which web pages may talk to rankd through a visitor's browser.

A browser sends requests wherever a page tells it to, with the visitor's
network position: a page on any site can reach a rankd on the visitor's own
machine.  Three rules keep pages out unless rankd lets them in:

- **Origin.**  A request a browser sends from a page carries an ``Origin``
  header.  It is accepted when it is rankd's own origin (the live page) or
  listed in ``--cors-origins``; any other is refused with 403, WebSocket
  and SSE included (a WebSocket is not protected by CORS).  Requests
  without ``Origin`` (curl, game servers, the Python client) are not
  browsers' cross-site requests and pass.
- **Host.**  Without credentials rankd listens only on loopback, so it must
  answer only requests addressed to loopback: a page whose own name is made
  to resolve to 127.0.0.1 (DNS rebinding) sends ``Host: its-name``, and is
  refused with 421.
- **CORS.**  Origins in ``--cors-origins`` get CORS headers, and their
  preflight requests (``OPTIONS``) are answered, so browser games on
  another origin can call rankd; nothing else gets them.

The page's own files (``/static/*``: the page's code and the JavaScript
client, public and the same for everyone) are the exception: any page,
one opened from a file included, may load them (``Access-Control-Allow-
Origin: *``); they carry no data.

The page and its files also tell the browser what they may do
(:meth:`OriginPolicy.page_headers`): scripts and styles from rankd only, no
inline script, requests to rankd only, never shown in another site's frame
(unless listed in ``--frame-ancestors``), no ``Referer`` sent on.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from urllib.parse import urlsplit

ALLOWED_METHODS = "GET, HEAD, POST, PUT, PATCH, DELETE"
ALLOWED_HEADERS = "Authorization, Content-Type"
EXPOSED_HEADERS = "Retry-After, WWW-Authenticate"
PREFLIGHT_MAX_AGE = "600"
#: The page's policy but for ``frame-ancestors``: its scripts, styles and
#: requests (WebSocket included: 'self' covers ws: and wss:) go to rankd only.
PAGE_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; "
               "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
               "form-action 'self'")
#: On every answer: a browser takes a body for the type it is sent as.
COMMON_HEADERS = {"X-Content-Type-Options": "nosniff"}
#: On ``/static/*``: public code, readable by a page of any origin.
PUBLIC_CORS_HEADERS = {"Access-Control-Allow-Origin": "*"}


def normalize_origin(origin: str) -> str:
    """``scheme://host[:port]`` lower-cased, default ports left out;
    ``ValueError`` for anything else (a path, a query, no host)."""
    parts = urlsplit(origin.strip())
    if (parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/")
            or parts.query or parts.fragment or parts.username or parts.password):
        raise ValueError(f"{origin!r} is not an origin (scheme://host[:port])")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + (f":{port}" if port and port != default else "")


def host_name(host: str) -> str:
    """The name part of a ``Host`` header (no port, IPv6 without brackets)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


@lru_cache(maxsize=256)  # every request asks; a hostile client's made-up names only evict
def addressed_to_loopback(host: str) -> bool:
    """Whether a ``Host`` header names this machine only."""
    return is_loopback_name(host_name(host))


def is_loopback_name(name: str) -> bool:
    """Whether a host name can only mean this machine."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class OriginPolicy:
    """The rules of the module docstring for one daemon."""

    #: Normalized origins allowed to call from a browser (CORS).
    allowed: frozenset[str] = field(default_factory=frozenset)
    #: Answer only requests addressed to a loopback name (no credentials).
    loopback_only: bool = False
    #: Normalized origins whose pages may show the live page in a frame.
    frame_ancestors: tuple[str, ...] = ()

    @classmethod
    def parse(cls, origins: Iterable[str], *, loopback_only: bool) -> OriginPolicy:
        return cls(frozenset(normalize_origin(o) for o in origins if o.strip()), loopback_only)

    def framed_by(self, origins: Iterable[str]) -> OriginPolicy:
        """This policy, with pages of ``origins`` allowed to frame the page."""
        return replace(self, frame_ancestors=tuple(sorted(
            {normalize_origin(o) for o in origins if o.strip()})))

    def page_headers(self) -> dict[str, str]:
        """The headers of the page and its files (see the module docstring)."""
        ancestors = " ".join(self.frame_ancestors) or "'none'"
        # No ``Referer`` on from the page (the only document with links: a JSON
        # answer needs no such header, and each one costs every request).
        headers = {"Content-Security-Policy": f"{PAGE_POLICY}; frame-ancestors {ancestors}",
                   "Referrer-Policy": "no-referrer"}
        if not self.frame_ancestors:
            headers["X-Frame-Options"] = "DENY"  # for browsers without frame-ancestors
        return headers

    def host_refused(self, host: str | None) -> str | None:
        """Why a request addressed to ``host`` is refused, or None."""
        if self.loopback_only and not addressed_to_loopback(host or ""):
            return (f"this rankd has no credentials and answers only requests addressed to "
                    f"localhost or a loopback address, not {host!r} (a web page may have "
                    "made its own name point here: DNS rebinding)")
        return None

    def origin_refused(self, origin: str | None, scheme: str, host: str | None) -> str | None:
        """Why a request from ``origin`` is refused, or None (no origin: not a
        browser's cross-site request)."""
        if origin is None or self.is_allowed(origin) or self._same_origin(origin, scheme, host):
            return None
        return (f"requests from pages of {origin} are refused: list the origin in "
                "--cors-origins to let its pages call rankd")

    def is_allowed(self, origin: str) -> bool:
        try:
            return normalize_origin(origin) in self.allowed
        except ValueError:
            return False

    @staticmethod
    def _same_origin(origin: str, scheme: str, host: str | None) -> bool:
        try:
            return normalize_origin(origin) == normalize_origin(f"{scheme}://{host or ''}")
        except ValueError:
            return False

    def cors_headers(self, origin: str | None) -> dict[str, str]:
        """Headers for an answer to an allowed origin (none for others)."""
        if origin is None or not self.is_allowed(origin):
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                "Access-Control-Expose-Headers": EXPOSED_HEADERS}

    def preflight_headers(self, origin: str) -> dict[str, str]:
        return {**self.cors_headers(origin), "Access-Control-Allow-Methods": ALLOWED_METHODS,
                "Access-Control-Allow-Headers": ALLOWED_HEADERS,
                "Access-Control-Max-Age": PREFLIGHT_MAX_AGE}
