"""When the server keeps a connection open after its response.

A training job talks to the server once per epoch, minutes apart, so its keep-alive connection
is rarely reused. Many kept-alive connections at once cost more than they save, and much of
the cost falls on the clients: httpx (through httpcore 1.0) scans every pooled connection, and
for each idle one all of them again, on every request and every response (encode/httpcore
#1035). With 32 concurrent clients on kept-alive connections, that bookkeeping took most of the
CPU of a client process here and capped it at about 90 trial cycles a second against a server
that answers instantly.

So the server keeps connections alive only while it is quiet: while at most `max_connections`
distinct connections have sent requests within the idle timeout. Busier than that, every
response carries `Connection: close`. Closing all connections rather than all but a few
matters: with a mix, the clients' requests that find a kept-alive connection overtake those
that must open one, and the latency tail grew threefold in that mode. A lone client, or a few,
keeps the latency benefit of a reused connection. Connections are told apart by the peer
address (host, port) of the ASGI scope; a connection that was closed still counts until the
timeout, which keeps the server from flapping between the two modes.
"""

from __future__ import annotations

import time
from typing import Any, Hashable

# uvicorn closes a connection after this many idle seconds (its default, which the server CLI
# pins); it is also the window in which connections are counted.
UVICORN_KEEPALIVE_TIMEOUT = 5.0


class KeepAlivePolicy:
    """Decides, per request, whether its connection may stay open after the response."""

    __slots__ = ("max_connections", "window", "_last_seen")

    def __init__(self, max_connections: int, window: float = UVICORN_KEEPALIVE_TIMEOUT) -> None:
        """Keep connections alive while at most `max_connections` were active in `window` s.

        `max_connections=0` closes every connection after one response.

        Raises:
            ValueError: `max_connections` is negative or `window` is not positive.

        """
        if max_connections < 0:
            raise ValueError(f"max_connections must be >= 0, got {max_connections}")
        if not window > 0:
            raise ValueError(f"window must be > 0, got {window}")
        self.max_connections = max_connections
        self.window = window
        # Peer address -> monotonic time of its last request, oldest first.
        self._last_seen: dict[Hashable, float] = {}

    def active_connections(self) -> int:
        """Distinct connections counted by the last decision."""
        return len(self._last_seen)

    def keep(self, client: Any, now: float | None = None) -> bool:
        """Whether the connection of peer `client` may stay open after this request.

        Args:
            client: The ASGI scope's `client`, a (host, port) pair; None when the server does
                not know it, which counts as one more connection.
            now: Monotonic time of the request (defaults to now).

        """
        if now is None:
            now = time.monotonic()
        if isinstance(client, list):  # Some servers hand the pair over as a list.
            client = tuple(client)
        seen = self._last_seen
        seen.pop(client, None)  # Re-inserted last, so the dict stays ordered by last use.
        seen[client] = now
        horizon = now - self.window
        while True:  # Forget connections idle for longer than the window, oldest first.
            oldest = next(iter(seen))
            if seen[oldest] > horizon:
                break
            del seen[oldest]
        return len(seen) <= self.max_connections
