"""Who is calling, and what they may do.

Credentials, checked the same way on every front-end:

* **JWT bearer tokens** (PyJWT): HS256 with a shared secret, or RS256/ES256
  with a public key; signature, ``exp`` and ``nbf`` are checked.  Scopes
  come from the ``scope`` claim (space-separated, as in OAuth) or a
  ``scopes`` list; ``sub`` names the caller, and a caller whose subject is a
  member may read that member's own standing.
* **API keys** for game servers: ``rk_<id>_<secret>``.  Only a SHA-256 hash
  of each key is configured (``id:sha256hex:scope+scope``), so the daemon
  never holds the key itself; comparison is constant-time.
* **Join tokens** for browsers, which cannot set headers on a WebSocket: a
  60-second ``read`` token from ``GET /v1/realtime/token``, signed with a
  key that lives only in this process, passed in the query string (the only
  credential accepted there: a URL ends up in logs, history and
  ``Referer`` headers).  A join token cannot mint another (a chain of them
  would outlive any 60 s), and it counts against the rate limits of the
  credential that minted it.

Scopes: ``read`` (reads, live feed), ``write`` (submissions, removing
members) and ``admin`` (boards).  ``admin`` implies nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt

from rankd.engine.errors import EngineError

SCOPES = ("read", "write", "admin")
JOIN_TOKEN_SECONDS = 60
JWT_LEEWAY_SECONDS = 5
_KEY_PREFIX = "rk_"


class Unauthorized(EngineError):
    """No valid credential (HTTP 401)."""

    code = "unauthorized"


class Forbidden(EngineError):
    """A valid credential without the needed scope (HTTP 403)."""

    code = "forbidden"


@dataclass(frozen=True)
class Principal:
    """An authenticated caller."""

    #: Who, for logs and rate limits: "jwt:<sub>", "key:<id>", "anonymous"; for a
    #: join token, the name of the credential that minted it (so its limits too).
    name: str
    scopes: frozenset[str]
    #: The token's subject (a member name, when the caller is a player).
    subject: str | None = None
    #: Whether the credential was a join token.
    joined: bool = False
    #: When the credential expires (Unix time; None: never, an API key):
    #: connections that outlive a request check it on use.
    expires: float | None = None

    def allows(self, scope: str) -> bool:
        return scope in self.scopes


ANONYMOUS_ALL = Principal("anonymous", frozenset(SCOPES))


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    digest: bytes
    scopes: frozenset[str]


def parse_scopes(text: str) -> frozenset[str]:
    scopes = frozenset(s for s in text.replace("+", " ").replace(",", " ").split() if s)
    unknown = scopes - set(SCOPES)
    if unknown:
        raise ValueError(f"unknown scope(s) {', '.join(sorted(unknown))}; scopes are "
                         f"{', '.join(SCOPES)}")
    return scopes


def parse_api_key_entry(entry: str) -> ApiKey:
    """``id:sha256hex:scope+scope`` as configured."""
    parts = entry.strip().split(":")
    if len(parts) != 3 or not parts[0] or len(parts[1]) != 64:
        raise ValueError("an API key entry is id:sha256-hex-of-the-key:scope+scope")
    try:
        digest = bytes.fromhex(parts[1])
    except ValueError:
        raise ValueError("an API key's hash must be 64 hex digits (SHA-256)") from None
    return ApiKey(parts[0], digest, parse_scopes(parts[2]))


def new_api_key(key_id: str, scopes: str) -> tuple[str, str]:
    """A fresh key and the config entry that accepts it: ``(key, entry)``."""
    if not key_id.isalnum():
        raise ValueError("a key id is letters and digits only")
    key = f"{_KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    digest = hashlib.sha256(key.encode()).hexdigest()
    return key, f"{key_id}:{digest}:{'+'.join(sorted(parse_scopes(scopes)))}"


@dataclass
class AuthConfig:
    jwt_secret: str | None = None
    jwt_public_key: Path | None = None
    api_keys: list[str] = field(default_factory=list)
    #: When set, a JWT must carry this ``iss`` / ``aud``.
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    #: A JWT valid for longer than this from now (or from its ``iat``) is
    #: refused: a leaked long-lived token is a standing key.  0: no limit.
    jwt_max_lifetime: float = 86_400.0

    @property
    def enabled(self) -> bool:
        return bool(self.jwt_secret or self.jwt_public_key or self.api_keys)


#: The longest credential considered (a JWT with generous claims fits).
MAX_CREDENTIAL_CHARS = 8192
#: HS256 and signing secrets shorter than this are refused (RFC 7518 3.2).
MIN_SECRET_BYTES = 32


def load_public_key(path: Path) -> Any:
    """The PEM public key in ``path``; ``ValueError`` for anything else (a
    private key, a certificate, not a key), said at start rather than as a
    500 on every request."""
    from cryptography.hazmat.primitives import serialization

    data = path.read_bytes()
    if b"PRIVATE KEY" in data:
        raise ValueError(f"{path} holds a private key: give --jwt-public-key the public half "
                         "(`openssl pkey -in private.pem -pubout`), and keep the private key "
                         "with the token issuer only")
    try:
        return serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path} is not a PEM public key ({exc})") from None


class Authenticator:
    """Turns a presented credential into a :class:`Principal`, or refuses."""

    def __init__(self, config: AuthConfig) -> None:
        self.enabled = config.enabled
        self._secret = config.jwt_secret
        self._issuer, self._audience = config.jwt_issuer, config.jwt_audience
        self._max_lifetime = config.jwt_max_lifetime
        if self._secret is not None and len(self._secret.encode()) < MIN_SECRET_BYTES:
            raise ValueError(f"the JWT secret is {len(self._secret.encode())} bytes; an HS256 "
                             f"secret needs at least {MIN_SECRET_BYTES} (e.g. `openssl rand "
                             "-hex 32`)")
        self._public_key = (load_public_key(config.jwt_public_key)
                            if config.jwt_public_key is not None else None)
        self._keys = {key.key_id: key for key in map(parse_api_key_entry, config.api_keys)}
        self._join_key = secrets.token_bytes(32)  # never leaves this process

    def authenticate(self, credential: str | None, *, join_only: bool = False) -> Principal:
        """The caller behind ``credential`` (a bearer token or an API key);
        ``join_only``: only a join token is accepted (a credential from a URL)."""
        if not self.enabled:
            return ANONYMOUS_ALL
        if not credential:
            raise Unauthorized("a credential is required (Authorization: Bearer <token>)")
        if len(credential) > MAX_CREDENTIAL_CHARS:
            # Refused before any parsing: a 1 MB token once cost 60 ms of event loop.
            raise Unauthorized(f"a credential is at most {MAX_CREDENTIAL_CHARS} characters")
        if join_only and not _is_join_token(credential):
            raise Unauthorized(URL_CREDENTIAL_REFUSED)
        if credential.startswith(_KEY_PREFIX):
            return self._api_key(credential)
        return self._token(credential)

    def _api_key(self, presented: str) -> Principal:
        key_id = presented[len(_KEY_PREFIX):].split("_", 1)[0]
        key = self._keys.get(key_id)
        digest = hashlib.sha256(presented.encode()).digest()
        if key is None or not hmac.compare_digest(digest, key.digest):
            raise Unauthorized("unknown API key")
        return Principal(f"key:{key_id}", key.scopes)

    def _token(self, token: str) -> Principal:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthorized("malformed token") from None
        algorithm = header.get("alg")
        join = header.get("typ") == "join"
        if join:
            key, algorithms = self._join_key, ["HS256"]
        elif algorithm == "HS256" and self._secret:
            key, algorithms = self._secret, ["HS256"]
        elif algorithm in ("RS256", "ES256") and self._public_key:
            key, algorithms = self._public_key, [algorithm]
        else:
            raise Unauthorized(f"tokens signed with {algorithm!r} are not accepted")
        required = ["exp"]
        checks: dict[str, Any] = {}
        if not join and self._issuer is not None:
            required.append("iss")
            checks["issuer"] = self._issuer
        if not join and self._audience is not None:
            required.append("aud")
            checks["audience"] = self._audience
        try:
            claims = jwt.decode(token, key, algorithms=algorithms, leeway=JWT_LEEWAY_SECONDS,
                                options={"require": required,
                                         "verify_aud": "audience" in checks}, **checks)
        except jwt.ExpiredSignatureError:
            raise Unauthorized("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise Unauthorized("the token is not valid yet (nbf)") from None
        except jwt.PyJWTError as exc:
            raise Unauthorized(f"invalid token: {exc}") from None
        if self._max_lifetime and not join:
            issued = claims.get("iat")
            since = issued if isinstance(issued, int | float) else time.time()
            if claims["exp"] - since > self._max_lifetime + JWT_LEEWAY_SECONDS:
                raise Unauthorized(f"the token is valid for longer than this server accepts "
                                   f"({self._max_lifetime:g} s); issue shorter-lived tokens")
        scopes = claims.get("scopes", claims.get("scope", ""))
        if isinstance(scopes, str):
            scopes = scopes.split()
        if not isinstance(scopes, list):
            raise Unauthorized("the token's scope claim is malformed")
        subject = claims.get("sub")
        # A join token counts against the rate limits of the credential that
        # minted it: its name is that credential's.
        name = str(claims.get("by", "?")) if join else f"jwt:{subject or '?'}"
        return Principal(name,
                         frozenset(s for s in scopes if s in SCOPES),
                         subject if isinstance(subject, str) else None, joined=join,
                         expires=float(claims["exp"]))

    def join_token(self, principal: Principal) -> str:
        """A short-lived read token for a browser's live-feed connection;
        :class:`Forbidden` when ``principal`` is itself a join token."""
        if principal.joined:
            raise Forbidden("a join token cannot mint join tokens: ask for one with the "
                            "credential that minted it")
        now = int(time.time())
        claims = {"scope": "read", "iat": now, "exp": now + JOIN_TOKEN_SECONDS,
                  "by": principal.name}
        if principal.subject:
            claims["sub"] = principal.subject
        return jwt.encode(claims, self._join_key, algorithm="HS256", headers={"typ": "join"})


URL_CREDENTIAL_REFUSED = (
    "only a join token (GET /v1/realtime/token) is accepted in a URL's ?token=: send API "
    "keys and JWTs in the Authorization header, as URLs end up in logs and browser history")


def _is_join_token(credential: str) -> bool:
    """Whether ``credential`` says it is a join token (its signature is
    checked later, like any token's)."""
    try:
        return jwt.get_unverified_header(credential).get("typ") == "join"
    except jwt.PyJWTError:
        return False


def require(principal: Principal, scope: str) -> None:
    """Raise :class:`Forbidden` unless ``principal`` has ``scope``."""
    if not principal.allows(scope):
        raise Forbidden(f"this operation needs the {scope!r} scope")
