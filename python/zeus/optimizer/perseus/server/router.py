"""The Perseus server: FastAPI routes and the `zeus-perseus-server` command.

Run it with `zeus-perseus-server --host 127.0.0.1 --port 7787` or
`uvicorn zeus.optimizer.perseus.server.router:app`; settings come from `PERSEUS_*`
environment variables (`PerseusSettings`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from zeus.optimizer.perseus.common import (
    GET_FREQUENCY_SCHEDULE_URL,
    GET_JOB_ID_URL,
    REGISTER_JOB_URL,
    REGISTER_RANK_URL,
    REPORT_PROFILING_RESULT_URL,
    FrequencySchedule,
    JobInfo,
    ProfilingResult,
    RankInfo,
)
from zeus.optimizer.perseus.server.config import PerseusSettings
from zeus.optimizer.perseus.server.job_manager import (
    JobManager,
    PerseusError,
    init_global_job_manager,
)
from zeus.util.logging import get_logger

logger = get_logger(__name__)

# The largest request body the server reads (bytes). A profiling result of a large pipeline is
# a few MB of JSON; a 40 MB body used to take 400 MB of memory before it was refused.
MAX_BODY_BYTES = 16 * 1024 * 1024


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes is answered 413 and never held.

    A declared `Content-Length` over the limit is refused before a byte is read; a chunked
    body is counted as it arrives and refused once past the limit.
    """

    def __init__(self, app: Any, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Serve one ASGI connection scope with the body limit."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                await self._refuse(send)
                return
        seen = 0
        too_large = False
        refused = False

        async def counted_receive() -> Any:
            nonlocal seen, too_large
            if too_large:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    # Stop reading; the app sees the client gone, and its answer (whatever
                    # it makes of a cut body) is replaced by the 413.
                    too_large = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Any) -> None:
            nonlocal refused
            if too_large:
                if not refused:
                    refused = True
                    await self._refuse(send)
                return
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            if not too_large:
                raise
        if too_large and not refused:
            await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"detail": f"Request body is larger than {self.limit} bytes"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class ErrorBody(BaseModel):
    """Every error answer: a message (a refused request) or FastAPI's validation errors (422).

    Attributes:
        detail: Why, or one entry per invalid field (its `loc` names it).

    """

    detail: Union[str, list[dict[str, Any]]]


_ERRORS = {
    400: "Refused: a body that is not UTF-8 JSON, a rank out of range or not registered, or a "
    "scheduler that failed on its input",
    404: "Unknown job",
    409: "Already done: the rank is registered, or its result for this round is in",
    422: "Invalid request: a field is missing or malformed (named in detail)",
    503: "The server is shutting down",
}


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI declaration of the error answers a route may give."""
    return {code: {"model": ErrorBody, "description": _ERRORS[code]} for code in codes}


def _server_generated_job_id(schema: dict[str, Any]) -> dict[str, Any]:
    """State in the schema that `JobInfo.job_id` must be left empty (the server sets it)."""
    job_id = schema["components"]["schemas"]["JobInfo"]["properties"]["job_id"]
    job_id["maxLength"] = 0
    job_id["description"] = "Left empty: the server generates the job id"
    return schema


def create_app(settings: Optional[PerseusSettings] = None) -> FastAPI:
    """Build the server app; settings default to the environment, read at startup."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        s = settings if settings is not None else PerseusSettings()
        logger.setLevel(getattr(logging, s.log_level, logging.INFO))
        manager = init_global_job_manager(s)
        manager.start()
        app.state.job_manager = manager
        # For the console script's SIGTERM hook (cli.py), which runs outside the loop.
        app.state.loop = asyncio.get_running_loop()
        try:
            yield
        finally:
            await manager.stop()

    app = FastAPI(title="Perseus server", lifespan=lifespan)
    app.add_middleware(BodyLimit)

    @app.exception_handler(PerseusError)
    async def _perseus_error(request: Request, exc: PerseusError) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content={"detail": exc.detail})

    def manager(request: Request) -> JobManager:
        return request.app.state.job_manager

    @app.post(REGISTER_JOB_URL, response_model=str, responses=_errors(400, 422))
    async def register_job(job_info: JobInfo, request: Request) -> str:
        return manager(request).register_job(job_info)

    @app.get(GET_JOB_ID_URL, response_model=str, responses=_errors(404, 422))
    async def get_job_id(job_metadata: str, request: Request) -> str:
        return manager(request).find_job(job_metadata)

    @app.post(REGISTER_RANK_URL, responses=_errors(400, 404, 409, 422))
    async def register_rank(job_id: str, rank_info: RankInfo, request: Request) -> None:
        await manager(request).register_rank(job_id, rank_info)

    @app.get(
        GET_FREQUENCY_SCHEDULE_URL,
        response_model=FrequencySchedule,
        responses=_errors(400, 404, 422, 503),
    )
    async def get_frequency_schedule(job_id: str, rank: int, request: Request):
        return await manager(request).get_frequency_schedule(job_id, rank)

    @app.post(REPORT_PROFILING_RESULT_URL, responses=_errors(400, 404, 409, 422))
    async def report_profiling_result(
        job_id: str, profiling_result: ProfilingResult, request: Request
    ) -> None:
        await manager(request).report_profiling_result(job_id, profiling_result)

    openapi = app.openapi
    app.openapi = lambda: _server_generated_job_id(openapi())  # type: ignore[method-assign]
    return app


app = create_app()
