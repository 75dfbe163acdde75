"""The process's TLS client context, shared by its HTTP clients.

Building one loads the CA bundle (tens of milliseconds, and a few megabytes): the
proxy's client, the compaction workers' and the CLI's use this one, made once. An
``ssl.SSLContext`` is meant to be shared by many connections.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def client_context() -> ssl.SSLContext:
    """What httpx makes for ``verify=True``: the CAs of ``SSL_CERT_FILE`` or
    ``SSL_CERT_DIR`` when set, else certifi's; certificates and host names checked."""
    return httpx.create_ssl_context()
