"""Every error the server answers: its types, its one JSON shape, and its rendering.

Each error answer, whatever the route or the cause (validation, unknown job, conflict,
missing token, oversized body, unknown path), is an `ErrorBody`:

    {"message": "Invalid request: body.batch_sizes: List should have at least 1 item",
     "detail": [{"loc": ["body", "batch_sizes"], "msg": "...", "type": "too_short"}]}

`message` is what the reference server answered (`{"message": ...}`) and what clients show;
`detail[].loc` names the offending part of the request: where it is (`body`, `query`,
`header`, `path`) and then the field, as FastAPI's validation errors did. The OpenAPI
document declares this shape for every error status of every route (`openapi.py`).

The service's errors keep the reference's names (`ZeusBSO*`); each carries its status code,
a `type` for `detail`, and the request fields it is about.
"""

from __future__ import annotations

import json
from typing import Any, List, Mapping, Optional, Sequence, Union

from pydantic import BaseModel, ValidationError

from zeus.exception import ZeusBaseError
from zeus.optimizer.batch_size.server.logic import NoConvergedBatchSizeError


class ErrorDetail(BaseModel):
    """One thing wrong with a request.

    Attributes:
        loc: Where: the part of the request (`body`, `query`, `header`, `path`), then the field
            and, inside lists, the index.
        msg: What is wrong with it.
        type: A stable machine-readable kind, e.g. `missing`, `too_short`, `unknown_job`.

    """

    loc: List[Union[str, int]]
    msg: str
    type: str


class ErrorBody(BaseModel):
    """The body of every error answer.

    Attributes:
        message: Human-readable summary, naming the fields (the reference's error key).
        detail: One entry per problem.

    """

    message: str
    detail: List[ErrorDetail]


class ZeusBSOServerBaseError(ZeusBaseError):
    """An error the server answers with an `ErrorBody` and `status_code`.

    Attributes:
        fields: The request fields the error is about (rendered as `detail[].loc`).

    """

    status_code = 500
    error_type = "server_error"

    def __init__(self, message: str, *fields: str) -> None:
        """Describe the error and name the fields it is about."""
        super().__init__(message)
        self.fields = fields


class ZeusBSOValueError(ZeusBSOServerBaseError):
    """The request does not fit what the server recorded (a batch size, an epoch)."""

    status_code = 409
    error_type = "conflict"


class ZeusBSONotFoundError(ZeusBSOServerBaseError):
    """The job or trial the request names does not exist."""

    status_code = 404
    error_type = "not_found"


class ZeusBSOJobConfigMismatchError(ZeusBSOServerBaseError):
    """A job id is registered again with a different configuration."""

    status_code = 409
    error_type = "config_mismatch"


class ZeusBSOServerRuntimeError(ZeusBSOServerBaseError):
    """The job cannot continue (no batch size survived a pruning round)."""

    status_code = 409
    error_type = "job_cannot_continue"


def service_error(exc: BaseException) -> Optional[ZeusBSOServerBaseError]:
    """The error a service exception answers with, or None if it is not one of ours."""
    if isinstance(exc, ZeusBSOServerBaseError):
        return exc
    if isinstance(exc, NoConvergedBatchSizeError):
        return ZeusBSOServerRuntimeError(str(exc), "job_id")
    return None


def render(message: str, detail: Sequence[Mapping[str, Any]]) -> bytes:
    """An `ErrorBody` as JSON bytes.

    ASCII-escaped, so that no character a client managed to put into a message can make the
    encoding fail.
    """
    return json.dumps(
        {"message": message, "detail": list(detail)}, separators=(",", ":"), allow_nan=False
    ).encode()


def error(where: str, field: Optional[str], kind: str, message: str) -> bytes:
    """An `ErrorBody` with one entry about `field` (or the whole of `where` if None)."""
    loc = [where] if field is None else [where, field]
    return render(message, [{"loc": loc, "msg": message, "type": kind}])


def from_service_error(err: ZeusBSOServerBaseError, where: str) -> bytes:
    """The body of a service error; its fields are in the request's `where` part."""
    locs = [[where, f] for f in err.fields] or [[where]]
    return render(
        err.message, [{"loc": loc, "msg": err.message, "type": err.error_type} for loc in locs]
    )


def from_validation(errors: Sequence[Mapping[str, Any]], where: str) -> bytes:
    """The 422 body of pydantic errors about the request's `where` part (`body`, `query`).

    Unlike FastAPI's default handler it does not echo the input back (which cannot even be
    serialised when it holds NaN), it names every field in `message` too.
    """
    detail = [
        {"loc": [where, *e.get("loc", ())], "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in errors
    ]
    summary = "; ".join(f"{'.'.join(str(p) for p in d['loc'])}: {d['msg']}" for d in detail)
    return render(f"Invalid request: {summary}", detail)


def from_validation_error(exc: ValidationError, where: str) -> bytes:
    """The 422 body of a pydantic `ValidationError`."""
    return from_validation(exc.errors(include_url=False, include_input=False), where)


# Statuses and what they mean, for the OpenAPI document.
DESCRIPTIONS = {
    401: "Missing or wrong bearer token (only when the server has one configured)",
    404: "Unknown job or trial",
    409: "Conflicts with what the server recorded",
    413: "Request body too large",
    422: "Invalid request: a field is missing, malformed or out of range (named in detail)",
}
