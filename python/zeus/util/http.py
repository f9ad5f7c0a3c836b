"""The one HTTP layer of zeus's clients: transports, tokens, timeouts, retries and error maps.

Every client of a remote service (zeusd and its power streams, the batch-size optimizer
server, the Perseus server, ElectricityMaps, OpenEI) talks through this module:

- `open_client` builds the `httpx.Client`: a TCP base URL or a Unix socket, the bearer token,
  the timeouts (`timeouts`, `CONNECT_TIMEOUT_S`), whether proxies from the environment apply.
- `lookup_token` is where a token comes from: the caller's, else an environment variable.
- A `Service` is one remote service as its client sees it: its `ErrorMap` (how a transport
  failure, an error status or a body that is not JSON becomes the client's own typed
  exception) and its `RetryPolicy` (which requests, statuses and failures are repeated, how
  often, after which pauses). Clients declare these; none repeats a request or translates an
  error itself. Reconnecting a stream that runs for hours (zeusd's hold connection, the power
  streams) stays with its reader, which paces it with a `Backoff` or its own setting.

httpx is imported on first use, not with this module: `zeus.device.zeusd` reads its token
through `lookup_token` whenever `zeus.device.get_gpus()` runs, and importing httpx takes about
a sixth of a second that a process which never talks to a daemon should not pay.

Example:
    >>> service = Service("example", ErrorMap(  # doctest: +SKIP
    ...     transport=lambda f: MyError(f"cannot reach {f.url}"),
    ...     status=lambda f: MyError(f"{f.url} answered HTTP {f.status}"),
    ... ), RetryPolicy(retries=3, statuses=frozenset({503})))
    >>> with open_client("http://127.0.0.1:8000", timeout=10.0) as client:  # doctest: +SKIP
    ...     data = service.send_json(client, "GET", "/things")

"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

if TYPE_CHECKING:
    import httpx

__all__ = [
    "CONNECT_TIMEOUT_S",
    "IDEMPOTENT_METHODS",
    "Backoff",
    "ErrorMap",
    "Failure",
    "RetryPolicy",
    "Service",
    "bearer_headers",
    "lookup_token",
    "lost_answer_failures",
    "never_sent_failures",
    "open_client",
    "timeouts",
]

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0
"""Seconds to wait for a connection. A server that accepts none in this long is down or
unreachable; the time a request may take once connected is each client's own."""

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
"""The methods RFC 9110 defines as idempotent: a repeat has the effect of one request."""


def lookup_token(
    token: Optional[str], variable: str, environ: Optional[Mapping[str, str]] = None
) -> Optional[str]:
    """The token to send: `token` when given, else the environment variable `variable`.

    An empty variable counts as unset (a job template that leaves it blank means "none").

    Args:
        token: The caller's token, or None to read the environment.
        variable: The environment variable that holds the token.
        environ: The environment to read (`os.environ` when None).

    Returns:
        The token, or None when neither gives one.

    """
    if token is not None:
        return token
    env = os.environ if environ is None else environ
    return env.get(variable) or None


def bearer_headers(token: Optional[str]) -> dict[str, str]:
    """`Authorization: Bearer <token>`, or no header when `token` is None."""
    return {} if token is None else {"Authorization": f"Bearer {token}"}


def timeouts(
    seconds: Optional[float], connect_s: Optional[float] = CONNECT_TIMEOUT_S
) -> httpx.Timeout:
    """An `httpx.Timeout`: `seconds` to read, write and wait for the pool, `connect_s` to connect.

    None waits forever for that phase.
    """
    import httpx

    return httpx.Timeout(seconds, connect=connect_s)


def open_client(
    base_url: str = "",
    *,
    timeout: Union[float, httpx.Timeout, None],
    socket_path: Optional[str] = None,
    token: Optional[str] = None,
    headers: Optional[Mapping[str, str]] = None,
    transport: Optional[httpx.BaseTransport] = None,
    trust_env: bool = True,
) -> httpx.Client:
    """A new `httpx.Client` for one service.

    Args:
        base_url: The URL requests are relative to. Over a Unix socket only its path counts;
            the host part is a placeholder.
        timeout: Seconds for every phase of a request, an `httpx.Timeout` (see `timeouts`), or
            None for no limit. Required: httpx's own default (5 s for everything) suits none
            of zeus's services.
        socket_path: Connect to this Unix socket instead of the URL's host and port.
        token: Sent as `Authorization: Bearer <token>` with every request, unless None.
        headers: More headers sent with every request.
        transport: An httpx transport to use instead of the default one (tests, or a
            transport of the caller's).
        trust_env: Whether `HTTP(S)_PROXY` and the like apply. False for a service on this
            node or network, whose requests (and token) must not travel through a proxy.

    Raises:
        ValueError: both `socket_path` and `transport` are given.

    """
    import httpx

    if socket_path is not None:
        if transport is not None:
            raise ValueError("open_client takes a socket_path or a transport, not both")
        transport = httpx.HTTPTransport(uds=socket_path)
    return httpx.Client(
        base_url=base_url,
        headers={**bearer_headers(token), **(headers or {})},
        timeout=timeout,
        transport=transport,
        trust_env=trust_env,
    )


def lost_answer_failures() -> tuple[type[Exception], ...]:
    """The transport failures after which a repeat may help, though the request may have arrived.

    Timeouts, broken connections and malformed answers (`httpx.TimeoutException`,
    `httpx.NetworkError`, `httpx.RemoteProtocolError`): only idempotent requests may be
    repeated after them.
    """
    import httpx

    return (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def never_sent_failures() -> tuple[type[Exception], ...]:
    """The transport failures that show the request never reached the server.

    No connection (`httpx.ConnectError`, `httpx.ConnectTimeout`) or none free in the pool
    (`httpx.PoolTimeout`): repeating any request after them is safe.
    """
    import httpx

    return (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class Backoff:
    """The pauses between attempts: `first_s`, then `factor` times longer each, up to `max_s`.

    Attributes:
        first_s: Seconds before the first repeat.
        factor: How much longer each next pause is (1 for a constant pause).
        max_s: The longest pause.

    Raises:
        ValueError: a negative pause or a factor below 1.

    """

    first_s: float = 0.2
    factor: float = 2.0
    max_s: float = math.inf

    def __post_init__(self) -> None:
        if not self.first_s >= 0:
            raise ValueError(f"first_s={self.first_s!r}: expected seconds >= 0")
        if not self.factor >= 1:
            raise ValueError(f"factor={self.factor!r}: expected >= 1")
        if not self.max_s >= 0:
            raise ValueError(f"max_s={self.max_s!r}: expected seconds >= 0")

    def delay_s(self, repeat: int) -> float:
        """Seconds to wait before repeat number `repeat` (0 for the first)."""
        try:
            return min(self.first_s * self.factor**repeat, self.max_s)
        except OverflowError:  # a poll bounded by time alone can repeat thousands of times
            return self.max_s


@dataclass(frozen=True)
class RetryPolicy:
    """Which failed requests are sent again, how many times, and after which pauses.

    A request is *idempotent* when the caller says so (`idempotent=` of `Service.send`), else
    when its method is in `methods`. An idempotent request is repeated after a failure in
    `failures` or an answer in `statuses`; any request after a failure in `unsent_failures`
    (by default none: a caller that knows the failure means the request never arrived opts
    in with `never_sent_failures()`). Attempts stop after `retries` repeats or, with
    `max_elapsed_s`, once that many seconds have passed since the first.

    Attributes:
        retries: Repeats after the first attempt; None for as many as `max_elapsed_s` allows.
        backoff: The pauses between attempts.
        methods: The methods taken as idempotent when the caller does not say.
        statuses: Answers after which an idempotent request is repeated (a server or gateway
            momentarily unavailable, by default).
        failures: Transport failures after which an idempotent request is repeated.
        unsent_failures: Transport failures after which any request is repeated.
        max_elapsed_s: No attempt starts later than this after the first; None for no limit.
        log_level: The level each repeat is logged at (DEBUG for a poll that expects to wait).

    Raises:
        ValueError: negative `retries` or `max_elapsed_s`, or neither bounds the attempts.

    """

    retries: Optional[int] = 0
    backoff: Backoff = field(default_factory=Backoff)
    methods: frozenset[str] = IDEMPOTENT_METHODS
    statuses: frozenset[int] = frozenset({502, 503, 504})
    failures: tuple[type[Exception], ...] = field(default_factory=lost_answer_failures)
    unsent_failures: tuple[type[Exception], ...] = ()
    max_elapsed_s: Optional[float] = None
    log_level: int = logging.WARNING

    def __post_init__(self) -> None:
        if self.retries is None and self.max_elapsed_s is None:
            raise ValueError("RetryPolicy needs retries or max_elapsed_s: it would never stop")
        if self.retries is not None and self.retries < 0:
            raise ValueError(f"retries={self.retries!r}: expected >= 0")
        if self.max_elapsed_s is not None and not self.max_elapsed_s >= 0:
            raise ValueError(f"max_elapsed_s={self.max_elapsed_s!r}: expected seconds >= 0")
        object.__setattr__(self, "methods", frozenset(m.upper() for m in self.methods))

    def is_idempotent(self, method: str, idempotent: Optional[bool] = None) -> bool:
        """Whether a `method` request may be repeated: the caller's word, else the method's."""
        return idempotent if idempotent is not None else method.upper() in self.methods

    def repeats_failure(self, error: Exception, method: str, idempotent: Optional[bool]) -> bool:
        """Whether this policy repeats a request that failed with `error` (attempts allowing)."""
        if isinstance(error, self.unsent_failures):
            return True
        return self.is_idempotent(method, idempotent) and isinstance(error, self.failures)

    def repeats_status(self, status: int, method: str, idempotent: Optional[bool]) -> bool:
        """Whether this policy repeats a request answered with `status` (attempts allowing)."""
        return status in self.statuses and self.is_idempotent(method, idempotent)

    def pause_s(self, attempts: int, elapsed_s: float) -> Optional[float]:
        """Seconds to wait before another attempt, or None when `attempts` made are the last.

        Args:
            attempts: Attempts made so far (1 after the first).
            elapsed_s: Seconds since the first attempt started.

        """
        if self.retries is not None and attempts > self.retries:
            return None
        pause = self.backoff.delay_s(attempts - 1)
        if self.max_elapsed_s is not None:
            left = self.max_elapsed_s - elapsed_s
            if left <= 0:
                return None
            pause = min(pause, left)
        return pause


@dataclass(frozen=True)
class Failure:
    """A request that got no answer its client accepts: what an `ErrorMap` turns into an error.

    Attributes:
        service: The service's name (`Service.name`).
        method: The request's method.
        url: The request's URL without its query string (which may hold a key).
        path: The URL's path.
        attempts: How many times the request was sent.
        retryable: Whether the retry policy repeats this kind of failure, so that it stopped
            only because its attempts ran out.
        error: The transport failure, or the error decoding a body; None for a status.
        response: The answer (read), or None when there was none.
        timeouts: The request's limits by phase (`connect`, `read`, `write`, `pool`), seconds.

    """

    service: str
    method: str
    url: str
    path: str
    attempts: int = 1
    retryable: bool = False
    error: Optional[Exception] = None
    response: Optional[httpx.Response] = None
    timeouts: Mapping[str, Optional[float]] = field(default_factory=dict)

    @property
    def status(self) -> Optional[int]:
        """The answer's status code, or None without an answer."""
        return None if self.response is None else self.response.status_code

    @property
    def text(self) -> str:
        """The answer's body as text ("" without an answer)."""
        return "" if self.response is None else self.response.text

    @property
    def timed_out(self) -> bool:
        """Whether the failure is a timeout (connecting, sending, reading or from the pool)."""
        import httpx

        return isinstance(self.error, httpx.TimeoutException)

    @property
    def timeout_s(self) -> Optional[float]:
        """The limit that ran out, seconds, when the failure is a timeout; else None."""
        import httpx

        phases = {
            httpx.ConnectTimeout: "connect",
            httpx.ReadTimeout: "read",
            httpx.WriteTimeout: "write",
            httpx.PoolTimeout: "pool",
        }
        for cls, phase in phases.items():
            if isinstance(self.error, cls):
                return self.timeouts.get(phase)
        return None


ErrorFactory = Callable[[Failure], Exception]


@dataclass(frozen=True)
class ErrorMap:
    """How one service's failures become its client's typed exceptions.

    Attributes:
        transport: The error for a request that got no answer (no connection, a timeout, a
            broken answer).
        status: The error for an answer whose status is not in `success`.
        body: The error for a successful answer whose body is not the JSON expected
            (`Service.send_json`); None lets the `ValueError` through.
        success: The statuses that count as success.
        keep_cause: Whether a mapped error keeps the httpx or JSON failure as its `__cause__`.
            False where the message says all there is to know (the traceback under it would
            only bury it).

    """

    transport: ErrorFactory
    status: ErrorFactory
    body: Optional[ErrorFactory] = None
    success: Container[int] = range(200, 300)
    keep_cause: bool = True


@dataclass(frozen=True)
class Service:
    """One remote service as its client sees it: its error map and its retry policy.

    Attributes:
        name: The service, for logs.
        errors: How its failures become exceptions.
        retry: Which failed requests are repeated; None repeats none.

    """

    name: str
    errors: ErrorMap
    retry: Optional[RetryPolicy] = None

    def send(
        self,
        client: httpx.Client,
        method: str,
        url: str,
        *,
        idempotent: Optional[bool] = None,
        **options: Any,
    ) -> httpx.Response:
        """Send a request, repeating it as the policy says, and return its successful answer.

        Args:
            client: The client to send with (`open_client`).
            method: The HTTP method.
            url: The URL, relative to the client's base URL.
            idempotent: Whether a repeat of this request has the effect of one (so that it
                may be repeated though it may have arrived); None decides by the method.
            **options: `params`, `headers`, `json`, `content`, `timeout`, ... as
                `httpx.Client.build_request` takes them.

        Raises:
            Exception: what `errors.transport` or `errors.status` makes of the failure.

        """
        return self._exchange(client, method, url, idempotent, False, options)

    def send_json(
        self,
        client: httpx.Client,
        method: str,
        url: str,
        *,
        idempotent: Optional[bool] = None,
        allow_empty: bool = False,
        **options: Any,
    ) -> Any:
        """`send`, then the answer's JSON body.

        Args:
            client: As `send`.
            method: As `send`.
            url: As `send`.
            idempotent: As `send`.
            allow_empty: Return None for an empty body instead of taking it as malformed.
            **options: As `send`.

        Raises:
            Exception: as `send`, or what `errors.body` makes of a body that is not JSON.

        """
        response = self._exchange(client, method, url, idempotent, False, options)
        if allow_empty and not response.content:
            return None
        try:
            return response.json()
        except ValueError as e:
            if self.errors.body is None:
                raise
            failure = self._failure(response.request, error=e, response=response)
            raise self.errors.body(failure) from (e if self.errors.keep_cause else None)

    @contextlib.contextmanager
    def stream(
        self,
        client: httpx.Client,
        method: str,
        url: str,
        *,
        idempotent: Optional[bool] = None,
        **options: Any,
    ) -> Iterator[httpx.Response]:
        """`send` for an answer read as it arrives: the open response, closed on exit.

        Opening follows the retry policy and the error map as `send` does; a failure while
        the body is read (a dropped connection, a read timeout) is the reader's, as the
        `httpx` exception.

        Raises:
            Exception: as `send`.

        """
        response = self._exchange(client, method, url, idempotent, True, options)
        try:
            yield response
        finally:
            response.close()

    # Inside.

    def _failure(self, request: httpx.Request, **details: Any) -> Failure:
        return Failure(
            service=self.name,
            method=request.method,
            url=str(request.url.copy_with(query=None)),
            path=request.url.path,
            timeouts=dict(request.extensions.get("timeout", {})),
            **details,
        )

    def _exchange(
        self,
        client: httpx.Client,
        method: str,
        url: str,
        idempotent: Optional[bool],
        stream: bool,
        options: dict[str, Any],
    ) -> httpx.Response:
        import httpx

        policy = self.retry
        started = time.monotonic()
        attempts = 0
        while True:
            attempts += 1
            request = client.build_request(method, url, **options)
            try:
                response = client.send(request, stream=stream)
            except httpx.RequestError as e:
                retryable = policy is not None and policy.repeats_failure(e, method, idempotent)
                pause = self._pause(policy, retryable, attempts, started)
                if pause is not None:
                    self._log_repeat(request, repr(e), pause)
                    time.sleep(pause)
                    continue
                failure = self._failure(request, attempts=attempts, retryable=retryable, error=e)
                raise self.errors.transport(failure) from (e if self.errors.keep_cause else None)
            if response.status_code in self.errors.success:
                return response
            try:
                if stream:  # for the error's message
                    response.read()
            finally:
                response.close()
            code = response.status_code
            retryable = policy is not None and policy.repeats_status(code, method, idempotent)
            pause = self._pause(policy, retryable, attempts, started)
            if pause is not None:
                self._log_repeat(request, f"HTTP {code}", pause)
                time.sleep(pause)
                continue
            failure = self._failure(
                request, attempts=attempts, retryable=retryable, response=response
            )
            raise self.errors.status(failure)

    @staticmethod
    def _pause(
        policy: Optional[RetryPolicy], retryable: bool, attempts: int, started: float
    ) -> Optional[float]:
        if policy is None or not retryable:
            return None
        return policy.pause_s(attempts, time.monotonic() - started)

    def _log_repeat(self, request: httpx.Request, why: str, pause: float) -> None:
        level = logging.WARNING if self.retry is None else self.retry.log_level
        logger.log(
            level,
            "%s: %s %s failed (%s); retrying in %.2f s",
            self.name,
            request.method,
            request.url.copy_with(query=None),
            why,
            pause,
        )
