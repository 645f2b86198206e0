"""Raw WebSocket bytes for tests that misbehave on purpose: an upgrade
request and masked client frames, built by hand so that they can be
anything a hostile client sends (a client library would refuse to)."""

from __future__ import annotations

import base64
import os


def upgrade_request(port: int, path: str = "/v1/boards/b/live", *,
                    token: str | None = None) -> bytes:
    """A WebSocket upgrade for ``path`` on the daemon at ``port`` (the Host
    header names it, as the DNS-rebinding check wants)."""
    key = base64.b64encode(os.urandom(16)).decode()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: 13\r\n{auth}\r\n").encode()


def masked_frame(opcode: int, payload: bytes) -> bytes:
    """One final client frame (clients must mask theirs)."""
    mask = os.urandom(4)
    size = len(payload)
    header = bytes([0x80 | opcode]) + (
        bytes([0x80 | size]) if size < 126 else bytes([0x80 | 126]) + size.to_bytes(2, "big")
        if size < 65536 else bytes([0x80 | 127]) + size.to_bytes(8, "big"))
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
