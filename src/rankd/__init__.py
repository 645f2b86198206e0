"""rankd: a durable, real-time ranking server."""

__version__ = "0.1.0"
