"""Bearer-token authentication of every request.

With a token configured (`ZEUS_BSO_TOKEN`), a request must carry `Authorization: Bearer
<token>`. The scheme name is case-insensitive (RFC 7235 section 2.1: `bearer` and `BEARER`
are `Bearer`), the token is compared in constant time (both sides are hashed first, so not even
its length leaks), and it covers every path the server answers, the API documentation
included, unless the documentation is made public on purpose (`ZEUS_BSO_PUBLIC_DOCS`).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Iterable, Optional

from zeus.optimizer.batch_size.server import errors

# What a refused request is answered with.
UNAUTHORIZED_HEADERS = ((b"www-authenticate", b"Bearer"),)
UNAUTHORIZED_MESSAGE = "Missing or wrong bearer token in the Authorization header"
UNAUTHORIZED_BODY = errors.error("header", "authorization", "unauthorized", UNAUTHORIZED_MESSAGE)


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class BearerAuth:
    """Checks the `Authorization` header of a request against the configured token."""

    __slots__ = ("_digest",)

    def __init__(self, token: str) -> None:
        """Accept requests that carry `token` (printable ASCII, see `config.ZeusBsoSettings`)."""
        self._digest = _digest(token.encode())

    def allows(self, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether the ASGI `headers` carry the token (the first `Authorization` header counts)."""
        value = _authorization(headers)
        if value is None:
            return False
        scheme, _, credentials = value.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(_digest(credentials.strip(b" ")), self._digest)


def _authorization(headers: Iterable[tuple[bytes, bytes]]) -> Optional[bytes]:
    for name, value in headers:
        if name == b"authorization":
            return value
    return None
