"""The FastAPI application: the reference REST API over `BsoService`.

- `POST /jobs` (`JobSpecFromClient` -> `CreatedJob`): 201 new, 200 identical re-registration,
  409 different configuration, 422 invalid.
- `DELETE /jobs?job_id=` (-> null): 200, 404 unknown job.
- `GET /jobs/batch_size?job_id=` (-> `TrialId`): 200, 400 unknown job, 409 nothing survived
  pruning.
- `POST /report` (`TrainingResult` -> `ReportResponse`): 200, 400 unknown job/trial or batch
  size, 422 invalid.
- `PATCH /trials` (`TrialId` -> null): 200 (a dispatched trial becomes failed), 404 unknown.

Errors the server raises on purpose answer `{"message": ...}`; validation errors answer
FastAPI's 422 body, whose `detail[].loc` names the offending field. With a token configured,
every request must carry `Authorization: Bearer <token>` or gets 401.
"""

from __future__ import annotations

import gc
import hmac
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional

from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from zeus.optimizer.batch_size.common import (
    DELETE_JOB_URL,
    GET_NEXT_BATCH_SIZE_URL,
    REGISTER_JOB_URL,
    REPORT_END_URL,
    REPORT_RESULT_URL,
    CreatedJob,
    JobSpecFromClient,
    ReportResponse,
    TrainingResult,
    TrialId,
)
from zeus.optimizer.batch_size.server.config import ZeusBsoSettings
from zeus.optimizer.batch_size.server.db import Database
from zeus.optimizer.batch_size.server.hot_path import (
    BsoApp,
    parse_json_body,
    server_error,
    validation_error_content,
)
from zeus.optimizer.batch_size.server.keepalive import KeepAlivePolicy
from zeus.optimizer.batch_size.server.logic import NoConvergedBatchSizeError
from zeus.optimizer.batch_size.server.service import BsoService, ZeusBSOServerBaseError

logger = logging.getLogger("zeus.optimizer.batch_size.server")


def _body_doc(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _json(model: BaseModel) -> Response:
    return Response(model.model_dump_json(), media_type="application/json")


def create_app(settings: Optional[ZeusBsoSettings] = None) -> BsoApp:
    """Build the application; the engine opens (and SQLite migrates) at start-up."""
    settings = settings or ZeusBsoSettings()
    logging.getLogger("zeus.optimizer.batch_size").setLevel(settings.log_level.upper())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = Database(settings.database_url, pool_size=settings.pool_size, echo=settings.echo_sql)
        if settings.should_migrate:
            await db.migrate()
        app.state.service = BsoService(db)
        # Everything imported and built so far lives as long as the server. Moved out of the
        # collector's sight, it is not traversed again by the full collections that the first
        # minutes of requests would otherwise trigger (each a pause of tens of milliseconds).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await db.dispose()

    dependencies = []
    expected: Optional[bytes] = f"Bearer {settings.token}".encode() if settings.token else None
    if expected is not None:

        async def check_token(authorization: Optional[str] = Header(default=None)) -> None:
            if authorization is None or not hmac.compare_digest(authorization.encode(), expected):
                raise HTTPException(
                    status_code=401,
                    detail="Missing or wrong bearer token in the Authorization header",
                    headers={"WWW-Authenticate": "Bearer"},
                )

        dependencies.append(Depends(check_token))

    app = BsoApp(title="Zeus batch size optimizer", lifespan=lifespan, dependencies=dependencies)
    app.hot_path_token = expected
    app.keepalive = KeepAlivePolicy(settings.max_keepalive)

    @app.exception_handler(ZeusBSOServerBaseError)
    @app.exception_handler(NoConvergedBatchSizeError)
    async def _bso_error(_request: Request, exc: Exception) -> JSONResponse:
        err = server_error(exc)
        assert err is not None
        return JSONResponse({"message": err.message}, status_code=err.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error_content(exc.errors()), status_code=422)

    def service(request: Request) -> BsoService:
        return request.app.state.service

    @app.post(REGISTER_JOB_URL, response_model=CreatedJob, status_code=201)
    async def register_job(job: JobSpecFromClient, request: Request) -> JSONResponse:
        created, is_new = await service(request).register(job)
        if is_new:
            logger.info("Registered job %s", created.job_id)
        return JSONResponse(created.model_dump(mode="json"), status_code=201 if is_new else 200)

    @app.delete(DELETE_JOB_URL)
    async def delete_job(job_id: str, request: Request) -> None:
        await service(request).delete(job_id)

    # The two endpoints of every training epoch are normally answered by `BsoApp` before
    # FastAPI sees them (see `hot_path.py`); these routes document them and serve what that
    # path passes on (a missing parameter, a wrong token).
    @app.get(GET_NEXT_BATCH_SIZE_URL, response_model=TrialId)
    async def predict(job_id: str, request: Request) -> Response:
        return _json(await service(request).predict(job_id))

    @app.post(
        REPORT_RESULT_URL, response_model=ReportResponse, openapi_extra=_body_doc(TrainingResult)
    )
    async def report(request: Request) -> Response:
        result = parse_json_body(await request.body(), TrainingResult)
        return _json(await service(request).report(result))

    @app.patch(REPORT_END_URL)
    async def end_trial(trial: TrialId, request: Request) -> None:
        await service(request).end_trial(trial)

    return app
