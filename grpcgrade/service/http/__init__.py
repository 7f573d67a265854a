"""The HTTP faces (`--http-port`), one module per protocol."""

from .openrlhf import build_http_app

__all__ = ["build_http_app"]
