"""The server's ASGI application: one route table and one dispatcher for every request.

The routes (the reference REST API over `BsoService`):

- `POST /jobs` (`JobSpecFromClient` -> `CreatedJob`): 201 new, 200 identical re-registration,
  409 different configuration, 422 invalid.
- `DELETE /jobs?job_id=` (-> null): 200, 404 unknown job.
- `GET /jobs/batch_size?job_id=[&request_id=]` (-> `TrialId`): 200, 404 unknown job, 409
  nothing survived pruning. A repeat of a `request_id` gets the trial that request started.
- `POST /report` (`TrainingResult` -> `ReportResponse`): 200, 404 unknown job or trial, 409 a
  batch size or epoch that contradicts the recorded trial, 422 invalid.
- `PATCH /trials` (`TrialId` -> null): 200 (a dispatched trial becomes failed), 404 unknown,
  409 wrong batch size.

Every request, whatever its path, goes through `BsoApp.__call__`: the keep-alive policy
(`keepalive.py`), the token check (`auth.py`), a look-up in the route table, the query and
body parsed and validated with the pydantic models of `common.py`, the service call, and the
answer. Every error answer is an `errors.ErrorBody` rendered by `errors.py`; a body larger
than `MAX_BODY_BYTES` is 413, an unknown path 404, a known path with another method 405. The
same route table generates the OpenAPI document (`openapi.py`), served at `/openapi.json` with
Swagger UI at `/docs` and ReDoc at `/redoc`.

Why not FastAPI's routing: its per-request machinery (routing, dependency solving, middleware
layers, Request/Response objects) cost about as much CPU per request as the database
transaction behind it (measured in-process, `benchmarks/bso_bench.py --in-process`), on the
two endpoints every training epoch calls.
"""

from __future__ import annotations

import gc
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional
from urllib.parse import parse_qsl

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import from_json

from zeus.optimizer.batch_size.common import (
    DELETE_JOB_URL,
    GET_NEXT_BATCH_SIZE_URL,
    REGISTER_JOB_URL,
    REPORT_END_URL,
    REPORT_RESULT_URL,
    CreatedJob,
    JobId,
    JobSpecFromClient,
    ReportResponse,
    RequestId,
    TrainingResult,
    TrialId,
)
from zeus.optimizer.batch_size.server import errors, openapi
from zeus.optimizer.batch_size.server.auth import (
    UNAUTHORIZED_BODY,
    UNAUTHORIZED_HEADERS,
    BearerAuth,
)
from zeus.optimizer.batch_size.server.config import ZeusBsoSettings
from zeus.optimizer.batch_size.server.db import Database
from zeus.optimizer.batch_size.server.keepalive import KeepAlivePolicy
from zeus.optimizer.batch_size.server.routes import QueryParam, Route
from zeus.optimizer.batch_size.server.service import BsoService

logger = logging.getLogger("zeus.optimizer.batch_size.server")

# A request body of this API is at most a few kilobytes (a job with `MAX_BATCH_SIZES` batch
# sizes is about 12 KiB); a larger one is refused before it is parsed.
MAX_BODY_BYTES = 64 * 1024

TITLE = "Zeus batch size optimizer"
OPENAPI_URL = "/openapi.json"
DOCS_URL = "/docs"
REDOC_URL = "/redoc"

_JSON = b"application/json"
_CLOSE_HEADER = (b"connection", b"close")


async def _register(service: BsoService, job: JobSpecFromClient) -> tuple[int, BaseModel]:
    created, is_new = await service.register(job)
    if is_new:
        logger.info("Registered job %s", created.job_id)
    return (201 if is_new else 200), created


async def _delete(service: BsoService, job_id: str) -> tuple[int, None]:
    await service.delete(job_id)
    return 200, None


async def _predict(
    service: BsoService, job_id: str, request_id: Optional[str]
) -> tuple[int, BaseModel]:
    return 200, await service.predict(job_id, request_id)


async def _report(service: BsoService, result: TrainingResult) -> tuple[int, BaseModel]:
    return 200, await service.report(result)


async def _end_trial(service: BsoService, trial: TrialId) -> tuple[int, None]:
    await service.end_trial(trial)
    return 200, None


_JOB_ID = QueryParam("job_id", TypeAdapter(JobId), "The job's id")
_REQUEST_ID = QueryParam(
    "request_id",
    TypeAdapter(RequestId),
    "The client's name for this request (printable ASCII, at most 64 characters): a repeat "
    "gets the trial the first one started instead of starting another",
    required=False,
)

ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        REGISTER_JOB_URL,
        _register,
        "Register a job (again)",
        body=JobSpecFromClient,
        answers=(
            (201, CreatedJob, "Registered; job_id is generated from the prefix if not given"),
            (200, CreatedJob, "Already registered with the same configuration"),
        ),
        errors=(409, 413, 422),
    ),
    Route(
        "DELETE",
        DELETE_JOB_URL,
        _delete,
        "Delete a job with its trials",
        query=(_JOB_ID,),
        answers=((200, None, "Deleted"),),
        errors=(404, 422),
    ),
    Route(
        "GET",
        GET_NEXT_BATCH_SIZE_URL,
        _predict,
        "Start a trial of the job: the batch size to train with",
        query=(_JOB_ID, _REQUEST_ID),
        answers=((200, TrialId, "The new trial (or the one this request_id started)"),),
        errors=(404, 409, 422),
    ),
    Route(
        "POST",
        REPORT_RESULT_URL,
        _report,
        "Report a trial's progress after an epoch; says whether to stop",
        body=TrainingResult,
        answers=((200, ReportResponse, "Recorded (or a repeat of the epoch last recorded)"),),
        errors=(404, 409, 413, 422),
    ),
    Route(
        "PATCH",
        REPORT_END_URL,
        _end_trial,
        "End a trial that will not report again (it fails unless it already ended)",
        body=TrialId,
        answers=((200, None, "Ended"),),
        errors=(404, 409, 413, 422),
    ),
)


class _ClientGone(Exception):
    """The client disconnected before its request body arrived."""


class _TooLarge(Exception):
    """The request body exceeds `MAX_BODY_BYTES`."""


class BsoApp:
    """The ASGI application (see the module docstring).

    Attributes:
        settings: The server's settings.
        service: The service, from start-up (ASGI lifespan, or `running()`) to shutdown.
        openapi: The OpenAPI document.

    """

    def __init__(self, settings: ZeusBsoSettings, routes: tuple[Route, ...] = ROUTES) -> None:
        """Build the routing and the documentation; the database opens at start-up."""
        self.settings = settings
        self.service: Optional[BsoService] = None
        self.keepalive = KeepAlivePolicy(settings.max_keepalive)
        self.auth = BearerAuth(settings.token) if settings.token else None
        self._routes: dict[str, dict[str, Route]] = {}
        for route in routes:
            self._routes.setdefault(route.path, {})[route.method] = route
        self._allow = {
            path: ", ".join(sorted(methods)).encode() for path, methods in self._routes.items()
        }
        self.openapi = openapi.document(routes, TITLE, bearer=self.auth is not None)
        self._docs = openapi.pages(self.openapi, TITLE, OPENAPI_URL, DOCS_URL, REDOC_URL)

    # -- lifespan -------------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[BsoApp]:
        """Open the database (migrating SQLite), serve, and close it at the end."""
        settings = self.settings
        db = Database(settings.database_url, pool_size=settings.pool_size, echo=settings.echo_sql)
        try:
            if settings.should_migrate:
                await db.migrate()
            self.service = BsoService(db)
            # Everything imported and built so far lives as long as the server. Moved out of
            # the collector's sight, it is not traversed again by the full collections that the
            # first minutes of requests would otherwise trigger (each a pause of tens of ms).
            gc.collect()
            gc.freeze()
            yield self
        finally:
            self.service = None
            await db.dispose()

    async def _lifespan(self, receive: Any, send: Any) -> None:
        await receive()  # lifespan.startup
        started = False
        try:
            async with self.running():
                await send({"type": "lifespan.startup.complete"})
                started = True
                await receive()  # lifespan.shutdown
        except BaseException as e:
            # Said so, the ASGI server stops instead of serving without a database.
            phase = "shutdown" if started else "startup"
            await send({"type": f"lifespan.{phase}.failed", "message": f"{e!r}"})
            raise
        await send({"type": "lifespan.shutdown.complete"})

    # -- requests -------------------------------------------------------------------------

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Serve one ASGI scope."""
        kind = scope["type"]
        if kind != "http":
            if kind == "lifespan":
                await self._lifespan(receive, send)
            return
        close = not self.keepalive.keep(scope.get("client"))
        path = scope["path"]
        methods = self._routes.get(path)
        if (
            self.auth is not None
            and not (methods is None and self.settings.public_docs and path in self._docs)
            and not self.auth.allows(scope["headers"])
        ):
            await _send(send, 401, UNAUTHORIZED_BODY, close, UNAUTHORIZED_HEADERS)
            return
        if methods is None:
            await self._serve_other(path, scope["method"], send, close)
            return
        route = methods.get(scope["method"])
        if route is None:
            message = f"Method {scope['method']} not allowed on {path}"
            body = errors.error("method", None, "method_not_allowed", message)
            await _send(send, 405, body, close, ((b"allow", self._allow[path]),))
            return
        try:
            status, body = await self._answer(route, scope, receive)
        except _ClientGone:
            return
        except _TooLarge:
            message = f"Request body is larger than {MAX_BODY_BYTES} bytes"
            await _send(send, 413, errors.error("body", None, "too_large", message), True)
            return
        await _send(send, status, body, close)

    async def _answer(self, route: Route, scope: Any, receive: Any) -> tuple[int, bytes]:
        """Parse and validate the request, call the service; the status and body to send."""
        args: list[Any] = []
        if route.query:
            found = _query(scope["query_string"])
            for param in route.query:
                value = found.get(param.name)
                if value is None and not param.required:
                    args.append(None)
                    continue
                if value is None:
                    return 422, errors.from_validation(
                        [{"loc": (param.name,), "msg": "Field required", "type": "missing"}],
                        "query",
                    )
                try:
                    args.append(param.adapter.validate_python(value))
                except ValidationError as e:
                    return 422, errors.from_validation(
                        [{**err, "loc": (param.name, *err["loc"])} for err in e.errors()],
                        "query",
                    )
        if route.body is not None:
            raw = await _read_body(receive)
            try:
                # NaN and Infinity are read, so that the model's bounds, not the parser, refuse
                # them and the error names the field.
                data = _whole_numbers_as_ints(from_json(raw, allow_inf_nan=True))
            except ValueError as e:  # Not UTF-8, not JSON, nested too deep.
                message = f"The body is not JSON: {e}"
                return 422, errors.error("body", None, "json_invalid", message)
            try:
                # Strict: what is not of the type the schema states (a number in a string, a
                # boolean for an integer) is refused rather than converted.
                args.append(route.body.model_validate(data, strict=True))
            except ValidationError as e:
                return 422, errors.from_validation_error(e, "body")
        service = self.service
        assert service is not None, "requests are served between start-up and shutdown"
        try:
            status, model = await route.handler(service, *args)
        except Exception as e:
            err = errors.service_error(e)
            if err is None:
                raise  # Not ours: the ASGI server logs it and answers 500.
            return err.status_code, errors.from_service_error(err, route.where)
        if model is None:
            return status, b"null"
        return status, model.__pydantic_serializer__.to_json(model)

    async def _serve_other(self, path: str, method: str, send: Any, close: bool) -> None:
        """The documentation pages, or 404."""
        page = self._docs.get(path)
        if page is None:
            body = errors.error("path", None, "not_found", f"No such path: {path}")
            await _send(send, 404, body, close)
        elif method not in ("GET", "HEAD"):
            body = errors.error("method", None, "method_not_allowed", f"{path} only takes GET")
            await _send(send, 405, body, close, ((b"allow", b"GET, HEAD"),))
        else:
            content_type, content = page
            await _send(send, 200, b"" if method == "HEAD" else content, close, (), content_type)


def _whole_numbers_as_ints(value: Any) -> Any:
    """`value` (parsed JSON) with every whole float in its dicts and lists made an int.

    JSON Schema counts `2.0` as an integer; pydantic's strict mode takes an int where a float
    is expected, but not a float where an int is.
    """
    if type(value) is dict:
        items: Any = value.items()
    elif type(value) is list:
        items = enumerate(value)
    else:
        return value
    for key, item in items:
        kind = type(item)
        if kind is float:
            if item.is_integer():
                value[key] = int(item)
        elif kind is dict or kind is list:
            _whole_numbers_as_ints(item)
    return value


def _query(query_string: bytes) -> dict[str, str]:
    # As Starlette reads scalar query parameters: latin-1, blanks kept, the last one wins.
    return dict(parse_qsl(query_string.decode("latin-1"), keep_blank_values=True))


async def _read_body(receive: Any) -> bytes:
    """The whole request body.

    Raises:
        _ClientGone: the client disconnected.
        _TooLarge: the body exceeds `MAX_BODY_BYTES`.

    """
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _send(
    send: Any,
    status: int,
    body: bytes,
    close: bool,
    extra: tuple[tuple[bytes, bytes], ...] = (),
    content_type: bytes = _JSON,
) -> None:
    headers = [(b"content-length", b"%d" % len(body)), (b"content-type", content_type), *extra]
    if close:
        headers.append(_CLOSE_HEADER)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def create_app(settings: Optional[ZeusBsoSettings] = None) -> BsoApp:
    """Build the application; settings default to the `ZEUS_BSO_*` environment."""
    settings = settings or ZeusBsoSettings()
    logging.getLogger("zeus.optimizer.batch_size").setLevel(settings.log_level.upper())
    return BsoApp(settings)
