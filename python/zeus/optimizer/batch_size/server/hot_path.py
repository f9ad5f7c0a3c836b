"""The two endpoints of every training epoch, answered without FastAPI's per-request machinery.

`GET /jobs/batch_size` and `POST /report` are what running jobs call, over and over. FastAPI
declares and documents them like the other endpoints, but a request first reaches
`BsoApp.__call__`, which answers these two directly when it can: the method and path match,
the bearer token matches (or none is configured) and, for a prediction, the query has a
`job_id`. It validates with the same pydantic models, calls the same `BsoService` methods and
shapes errors with the same functions as the FastAPI exception handlers in `app.py`, so the
answer is the same either way. Any other request (another endpoint, a missing or wrong token,
a missing parameter) goes to FastAPI untouched.

Why: FastAPI's routing, dependency solving, middleware layers and Request/Response objects
cost about as much CPU per request as the database transaction behind it (measured in-process,
`benchmarks/bso_bench.py --in-process`).

Every request, on either path, also passes the keep-alive policy (`keepalive.py`).
"""

from __future__ import annotations

import hmac
import json
from typing import Any, Awaitable, Mapping, Optional, Sequence, TypeVar
from urllib.parse import parse_qsl

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from zeus.optimizer.batch_size.common import (
    GET_NEXT_BATCH_SIZE_URL,
    REPORT_RESULT_URL,
    TrainingResult,
)
from zeus.optimizer.batch_size.server.keepalive import KeepAlivePolicy
from zeus.optimizer.batch_size.server.logic import NoConvergedBatchSizeError
from zeus.optimizer.batch_size.server.service import (
    BsoService,
    ZeusBSOServerBaseError,
    ZeusBSOServerRuntimeError,
)

ModelT = TypeVar("ModelT", bound=BaseModel)

# A report is a few hundred bytes; a body this large is not one.
MAX_REPORT_BODY_BYTES = 64 * 1024

_JSON_HEADER = (b"content-type", b"application/json")
_CLOSE_HEADER = (b"connection", b"close")


# ---------------------------------------------------------------------------------------------
# Request parsing and error bodies, shared with the FastAPI routes and handlers of `app.py`.


def parse_json_body(raw: bytes, model: type[ModelT]) -> ModelT:
    """Parse and validate a JSON request body.

    The standard `json` module reads NaN and Infinity, so the model's finiteness checks, not
    the parser, reject them and the error names the field.

    Raises:
        RequestValidationError: the body is not JSON, or does not fit `model`; each error's
            `loc` starts with "body" and names the field.

    """
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise RequestValidationError(
            [{"loc": ("body",), "msg": f"JSON decode error: {e}", "type": "json_invalid"}]
        ) from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(
            [
                {"loc": ("body", *err["loc"]), "msg": err["msg"], "type": err["type"]}
                for err in e.errors()
            ]
        ) from None


def validation_error_content(errors: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The 422 body: a message naming every bad field, and FastAPI-style `detail` entries.

    FastAPI's default handler echoes the input back, which cannot even be serialised when it
    holds NaN or infinity; this names the fields and says what is wrong instead.
    """
    detail = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in errors
    ]
    message = "; ".join(f"{'.'.join(str(p) for p in d['loc'])}: {d['msg']}" for d in detail)
    return {"message": f"Invalid request: {message}", "detail": detail}


def server_error(exc: Exception) -> Optional[ZeusBSOServerBaseError]:
    """The error a service exception answers with, or None if it is not one of ours."""
    if isinstance(exc, ZeusBSOServerBaseError):
        return exc
    if isinstance(exc, NoConvergedBatchSizeError):
        return ZeusBSOServerRuntimeError(str(exc))
    return None


def render_json(content: Any) -> bytes:
    """JSON bytes as Starlette's `JSONResponse` renders them."""
    return json.dumps(
        content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode("utf-8")


# ---------------------------------------------------------------------------------------------
# The application.


class _ClientGone(Exception):
    """The client disconnected before its request body arrived."""


class BsoApp(FastAPI):
    """The server's FastAPI application, with the per-epoch endpoints' short path in front.

    `app.create_app` sets `hot_path_token` (the full expected `Authorization` header value, or
    None without auth) and `keepalive`.
    """

    hot_path_token: Optional[bytes] = None
    keepalive: Optional[KeepAlivePolicy] = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Serve one ASGI connection scope."""
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if self.keepalive is not None and not self.keepalive.keep(scope.get("client")):
            send = _closing(send)
        path, method = scope["path"], scope["method"]
        if path == GET_NEXT_BATCH_SIZE_URL and method == "GET" and self._authorized(scope):
            job_id = _last_query_value(scope["query_string"], "job_id")
            if job_id is not None:
                await self._predict(job_id, send)
                return
        elif path == REPORT_RESULT_URL and method == "POST" and self._authorized(scope):
            try:
                body = await _read_body(receive, MAX_REPORT_BODY_BYTES)
            except _ClientGone:
                return
            await self._report(body, send)
            return
        await super().__call__(scope, receive, send)

    def _authorized(self, scope: Any) -> bool:
        expected = self.hot_path_token
        if expected is None:
            return True
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, expected)
        return False

    @property
    def _service(self) -> BsoService:
        return self.state.service

    async def _predict(self, job_id: str, send: Any) -> None:
        await _answer(self._service.predict(job_id), send)

    async def _report(self, body: Optional[bytes], send: Any) -> None:
        if body is None:
            content = {"message": f"Request body is larger than {MAX_REPORT_BODY_BYTES} bytes"}
            await _send_json(send, 413, render_json(content), close=True)
            return
        try:
            result = parse_json_body(body, TrainingResult)
        except RequestValidationError as e:
            await _send_json(send, 422, render_json(validation_error_content(e.errors())))
            return
        await _answer(self._service.report(result), send)


async def _answer(call: Awaitable[BaseModel], send: Any) -> None:
    """Send the model a service call returns, or the error it raises."""
    try:
        model = await call
    except Exception as e:
        err = server_error(e)
        if err is None:
            raise  # Not ours: the ASGI server logs it and answers 500.
        await _send_json(send, err.status_code, render_json({"message": err.message}))
        return
    await _send_json(send, 200, model.model_dump_json().encode())


def _last_query_value(query_string: bytes, name: str) -> Optional[str]:
    # As Starlette reads a scalar query parameter: latin-1, blanks kept, the last one wins.
    value = None
    for key, v in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if key == name:
            value = v
    return value


async def _read_body(receive: Any, limit: int) -> Optional[bytes]:
    """The whole request body, or None once it exceeds `limit` bytes."""
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send_json(send: Any, status: int, body: bytes, close: bool = False) -> None:
    headers = [(b"content-length", str(len(body)).encode()), _JSON_HEADER]
    if close:
        headers.append(_CLOSE_HEADER)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _closing(send: Any) -> Any:
    """`send`, with `Connection: close` added to the response headers."""

    async def send_closing(message: Any) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            if _CLOSE_HEADER not in headers:
                headers.append(_CLOSE_HEADER)
            message = {**message, "headers": headers}
        await send(message)

    return send_closing
