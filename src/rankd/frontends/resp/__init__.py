"""The Redis-protocol (RESP) front-end (issue 27, being built): Redis
clients in any language talk to rankd's boards as sorted sets.

``protocol`` reads requests and writes replies; the server and its
commands come next.
"""
