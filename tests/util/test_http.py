"""`zeus.util.http` against a real local HTTP server, over TCP and over a Unix socket."""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional, Union
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from zeus.util import http


@dataclass
class Answer:
    """One scripted answer: a status and a body (JSON unless bytes), or a wait for `release`."""

    status: int = 200
    body: Union[bytes, Any] = field(default_factory=dict)
    wait_for_release: bool = False


@dataclass
class Seen:
    """A request the server received."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]


class ScriptedServer:
    """A local server answering each (method, path) with its scripted answers in turn.

    The last answer of a script repeats; a path without one gets 404. An answer with
    `wait_for_release` holds the request until `release` is set (a server that does not
    answer in time), then answers 200.
    """

    def __init__(self, socket_path: Optional[Path] = None) -> None:
        """Serve in a daemon thread on a free port of 127.0.0.1, or on `socket_path`."""
        self.script: dict[tuple[str, str], list[Answer]] = {}
        self.seen: list[Seen] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                key = (self.command, url.path)
                server.seen.append(
                    Seen(self.command, url.path, parse_qs(url.query), dict(self.headers))
                )
                answers = server.script.get(key, [Answer(404, {"error": "no such path"})])
                answer = answers.pop(0) if len(answers) > 1 else answers[0]
                if answer.wait_for_release:
                    server.release.wait(timeout=30)
                    answer = Answer()
                body = answer.body
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting: what a timeout test wants

            do_GET = do_POST = do_PUT = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server: socketserver.BaseServer
        if socket_path is None:
            tcp = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            tcp.daemon_threads = True
            self.server = tcp
            self.url = f"http://127.0.0.1:{tcp.server_address[1]}"
        else:
            uds = socketserver.ThreadingUnixStreamServer(str(socket_path), Handler)
            uds.daemon_threads = True
            self.server = uds
            self.url = "http://placeholder"  # the host of a socket's URL is not used
        # A short poll, so that `close` returns at once.
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def count(self, method: str, path: str) -> int:
        """How many `method path` requests arrived."""
        return sum(1 for s in self.seen if (s.method, s.path) == (method, path))

    def close(self) -> None:
        """Answer any held request, stop serving, free the port or socket."""
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class ServiceError(Exception):
    """The typed error of the test's service: which mapping made it, and from what."""

    def __init__(self, kind: str, failure: http.Failure) -> None:
        super().__init__(f"{kind}: {failure.method} {failure.url} ({failure.status})")
        self.kind = kind
        self.failure = failure


def service(retry: Optional[http.RetryPolicy] = None, keep_cause: bool = True) -> http.Service:
    return http.Service(
        "test service",
        http.ErrorMap(
            transport=lambda f: ServiceError("transport", f),
            status=lambda f: ServiceError("status", f),
            body=lambda f: ServiceError("body", f),
            keep_cause=keep_cause,
        ),
        retry,
    )


# No pause between attempts: the tests count attempts, not time.
NOW = http.Backoff(first_s=0.0)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    srv = ScriptedServer()
    yield srv
    srv.close()


@pytest.fixture
def client(server: ScriptedServer) -> Iterator[httpx.Client]:
    with http.open_client(server.url, timeout=10.0) as c:
        yield c


def test_an_idempotent_get_is_repeated_after_503_until_it_succeeds(
    server: ScriptedServer, client: httpx.Client
) -> None:
    server.script[("GET", "/thing")] = [Answer(503), Answer(503), Answer(200, {"ok": 1})]
    policy = http.RetryPolicy(retries=3, backoff=NOW)
    assert service(policy).send_json(client, "GET", "/thing") == {"ok": 1}
    assert server.count("GET", "/thing") == 3


def test_a_post_is_not_repeated_unless_the_caller_says_it_is_idempotent(
    server: ScriptedServer, client: httpx.Client
) -> None:
    server.script[("POST", "/thing")] = [Answer(503), Answer(200, {"ok": 1})]
    policy = http.RetryPolicy(retries=3, backoff=NOW)
    with pytest.raises(ServiceError) as info:
        service(policy).send(client, "POST", "/thing", json={"x": 1})
    assert info.value.kind == "status"
    assert info.value.failure.status == 503 and info.value.failure.attempts == 1
    assert not info.value.failure.retryable
    assert server.count("POST", "/thing") == 1
    # The caller knows the server takes a repeat as the request itself.
    server.script[("POST", "/thing")] = [Answer(503), Answer(200, {"ok": 1})]
    answer = service(policy).send_json(client, "POST", "/thing", idempotent=True, json={})
    assert answer == {"ok": 1}
    assert server.count("POST", "/thing") == 3


def test_repeats_stop_after_the_policys_retries(
    server: ScriptedServer, client: httpx.Client
) -> None:
    server.script[("GET", "/down")] = [Answer(503, {"error": "busy"})]
    with pytest.raises(ServiceError) as info:
        service(http.RetryPolicy(retries=2, backoff=NOW)).send(client, "GET", "/down")
    failure = info.value.failure
    assert (failure.attempts, failure.retryable, failure.status) == (3, True, 503)
    assert json.loads(failure.text) == {"error": "busy"}
    assert server.count("GET", "/down") == 3
    # A status the policy does not name is final at once.
    server.script[("GET", "/gone")] = [Answer(410)]
    with pytest.raises(ServiceError, match=r"status: GET .*/gone \(410\)"):
        service(http.RetryPolicy(retries=2, backoff=NOW)).send(client, "GET", "/gone")
    assert server.count("GET", "/gone") == 1
    # Without a policy nothing is repeated.
    with pytest.raises(ServiceError):
        service().send(client, "GET", "/down")
    assert server.count("GET", "/down") == 4


def test_a_timeout_becomes_the_mapped_error_naming_the_url(server: ScriptedServer) -> None:
    server.script[("GET", "/slow")] = [Answer(wait_for_release=True)]
    with http.open_client(server.url, timeout=http.timeouts(0.2)) as client:
        with pytest.raises(ServiceError) as info:
            service().send(client, "GET", "/slow", params={"api_key": "s3cret"})
    server.release.set()
    error = info.value
    assert error.kind == "transport" and error.failure.timed_out
    assert error.failure.timeout_s == pytest.approx(0.2)  # the read's limit
    assert isinstance(error.__cause__, httpx.ReadTimeout)
    # The URL without its query string, which may hold a key.
    assert error.failure.url == f"{server.url}/slow"
    assert f"GET {server.url}/slow" in str(error) and "s3cret" not in str(error)


def test_an_error_map_may_drop_the_httpx_cause() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with http.open_client(closed, timeout=5.0) as client:
        with pytest.raises(ServiceError) as info:
            service(keep_cause=False).send(client, "GET", "/x")
    assert info.value.kind == "transport" and not info.value.failure.timed_out
    assert info.value.failure.timeout_s is None
    assert isinstance(info.value.failure.error, httpx.ConnectError)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_a_request_that_never_arrived_is_repeated_where_the_policy_says() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    policy = http.RetryPolicy(retries=2, backoff=NOW, unsent_failures=http.never_sent_failures())
    with http.open_client(closed, timeout=5.0) as client:
        with pytest.raises(ServiceError) as info:
            service(policy).send(client, "POST", "/x")
        assert (info.value.failure.attempts, info.value.failure.retryable) == (3, True)
        # By default a POST is not repeated, even when it never arrived.
        with pytest.raises(ServiceError) as info:
            service(http.RetryPolicy(retries=2, backoff=NOW)).send(client, "POST", "/x")
        assert (info.value.failure.attempts, info.value.failure.retryable) == (1, False)


def test_the_token_is_sent_as_a_bearer_header(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.script[("GET", "/me")] = [Answer(200, {})]
    monkeypatch.setenv("ZEUS_TEST_TOKEN", "from-env")
    for given, sent in [(None, "Bearer from-env"), ("given", "Bearer given")]:
        token = http.lookup_token(given, "ZEUS_TEST_TOKEN")
        with http.open_client(server.url, timeout=10.0, token=token) as client:
            service().send(client, "GET", "/me")
        assert server.seen[-1].headers.get("Authorization") == sent
    monkeypatch.setenv("ZEUS_TEST_TOKEN", "")  # empty counts as unset
    token = http.lookup_token(None, "ZEUS_TEST_TOKEN")
    assert token is None
    with http.open_client(server.url, timeout=10.0, token=token) as client:
        service().send(client, "GET", "/me")
    assert "Authorization" not in server.seen[-1].headers
    assert http.lookup_token(None, "ZEUS_TEST_TOKEN", {"ZEUS_TEST_TOKEN": "t"}) == "t"


def test_a_unix_socket_transport(tmp_path: Path) -> None:
    sock = tmp_path / "api.sock"
    srv = ScriptedServer(socket_path=sock)
    try:
        srv.script[("GET", "/thing")] = [Answer(503), Answer(200, {"over": "socket"})]
        policy = http.RetryPolicy(retries=1, backoff=NOW)
        with http.open_client(srv.url, timeout=10.0, socket_path=str(sock), token="t") as client:
            assert service(policy).send_json(client, "GET", "/thing", params={"a": "1"}) == {
                "over": "socket"
            }
        assert srv.count("GET", "/thing") == 2
        assert srv.seen[-1].query == {"a": ["1"]}
        assert srv.seen[-1].headers["Authorization"] == "Bearer t"
    finally:
        srv.close()
    with pytest.raises(ValueError, match="socket_path or a transport"):
        http.open_client(timeout=1.0, socket_path=str(sock), transport=httpx.HTTPTransport())


def test_a_stream_is_checked_before_it_is_read(
    server: ScriptedServer, client: httpx.Client
) -> None:
    server.script[("GET", "/events")] = [Answer(403, {"error": "no token"}), Answer(200, [1, 2])]
    with pytest.raises(ServiceError) as info:
        with service().stream(client, "GET", "/events"):
            pytest.fail("a refused stream must not be entered")
    assert info.value.failure.status == 403
    assert "no token" in info.value.failure.text  # read before the answer was closed
    with service().stream(client, "GET", "/events") as response:
        assert json.loads(response.read()) == [1, 2]
    assert response.is_closed


def test_a_body_that_is_not_json_is_mapped(server: ScriptedServer, client: httpx.Client) -> None:
    server.script[("GET", "/text")] = [Answer(200, b"not json")]
    server.script[("GET", "/empty")] = [Answer(200, b"")]
    with pytest.raises(ServiceError) as info:
        service().send_json(client, "GET", "/text")
    assert info.value.kind == "body" and info.value.failure.text == "not json"
    assert isinstance(info.value.__cause__, ValueError)
    assert service().send_json(client, "GET", "/empty", allow_empty=True) is None
    with pytest.raises(ServiceError, match="body"):
        service().send_json(client, "GET", "/empty")
    # Without a body mapping the ValueError goes through.
    plain = http.Service("plain", http.ErrorMap(transport=RuntimeError, status=RuntimeError))
    with pytest.raises(ValueError):
        plain.send_json(client, "GET", "/text")


def test_success_is_what_the_error_map_says(server: ScriptedServer, client: httpx.Client) -> None:
    server.script[("GET", "/created")] = [Answer(201, {"id": 7})]
    assert service().send_json(client, "GET", "/created") == {"id": 7}  # any 2xx by default
    only_200 = http.Service(
        "only 200",
        http.ErrorMap(
            transport=lambda f: ServiceError("transport", f),
            status=lambda f: ServiceError("status", f),
            success=(200,),
        ),
    )
    with pytest.raises(ServiceError, match=r"\(201\)"):
        only_200.send(client, "GET", "/created")


def test_backoff_grows_to_its_cap() -> None:
    backoff = http.Backoff(first_s=0.1, factor=2.0, max_s=0.5)
    assert [backoff.delay_s(i) for i in range(5)] == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
    assert backoff.delay_s(100_000) == 0.5  # no overflow far past the cap
    assert http.Backoff(first_s=0.05, factor=1.0).delay_s(1000) == 0.05
    for bad in [dict(first_s=-1.0), dict(factor=0.5), dict(max_s=-1.0)]:
        with pytest.raises(ValueError):
            http.Backoff(**bad)  # type: ignore[arg-type]


def test_a_policy_bounded_by_time_stops_when_its_time_is_up() -> None:
    policy = http.RetryPolicy(
        retries=None, max_elapsed_s=1.0, backoff=http.Backoff(first_s=0.3, factor=1.0)
    )
    assert policy.pause_s(attempts=50, elapsed_s=0.2) == pytest.approx(0.3)
    assert policy.pause_s(attempts=51, elapsed_s=0.9) == pytest.approx(0.1)  # not past it
    assert policy.pause_s(attempts=52, elapsed_s=1.0) is None
    counted = http.RetryPolicy(retries=2, backoff=http.Backoff(first_s=0.1))
    assert [counted.pause_s(n, 0.0) for n in (1, 2, 3)] == pytest.approx([0.1, 0.2, None])
    with pytest.raises(ValueError, match="never stop"):
        http.RetryPolicy(retries=None)
    with pytest.raises(ValueError, match="retries=-1"):
        http.RetryPolicy(retries=-1)


def test_which_requests_a_policy_repeats() -> None:
    policy = http.RetryPolicy(retries=1, methods=frozenset({"get"}))
    request = httpx.Request("GET", "http://x/")
    lost = httpx.ReadTimeout("lost", request=request)
    refused = httpx.ConnectError("refused", request=request)
    assert policy.repeats_failure(lost, "GET", None)
    assert not policy.repeats_failure(lost, "PUT", None)  # not in this policy's methods
    assert not policy.repeats_failure(refused, "POST", None)
    assert policy.repeats_failure(lost, "POST", idempotent=True)
    assert not policy.repeats_failure(lost, "GET", idempotent=False)
    assert policy.repeats_status(503, "GET", None) and not policy.repeats_status(500, "GET", None)
