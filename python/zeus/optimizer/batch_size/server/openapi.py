"""The OpenAPI document of the server, generated from its route table (`app.ROUTES`).

The document is what the dispatcher does, not a second description of it: each route's query
parameters, body and answers come from the same `Route` entries and pydantic models that serve
the requests, so every constraint of `common.py` (ranges, lengths, list sizes) appears in it,
and every error status a route may answer is declared with the one `errors.ErrorBody` shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

import zeus
from zeus.optimizer.batch_size.server import errors

if TYPE_CHECKING:
    from zeus.optimizer.batch_size.server.routes import Route

_REF = "#/components/schemas/{model}"
_BEARER = "bearerAuth"


def document(routes: Sequence[Route], title: str, *, bearer: bool) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `routes`; with `bearer`, every operation needs the token."""
    models: list[tuple[type[BaseModel], Any]] = [(errors.ErrorBody, "serialization")]
    for route in routes:
        if route.body is not None:
            models.append((route.body, "validation"))
        models.extend((m, "serialization") for _, m, _ in route.answers if m is not None)
    refs, top = models_json_schema(list(dict.fromkeys(models)), ref_template=_REF)
    error_ref = refs[(errors.ErrorBody, "serialization")]

    def content(schema: dict[str, Any]) -> dict[str, Any]:
        return {"application/json": {"schema": schema}}

    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        responses: dict[str, Any] = {}
        for status, model, description in route.answers:
            schema = {"type": "null"} if model is None else refs[(model, "serialization")]
            responses[str(status)] = {"description": description, "content": content(schema)}
        for status in sorted({*route.errors, *((401,) if bearer else ())}):
            answer: dict[str, Any] = {
                "description": errors.DESCRIPTIONS[status],
                "content": content(error_ref),
            }
            if status == 401:
                answer["headers"] = {
                    "WWW-Authenticate": {"required": True, "schema": {"type": "string"}}
                }
            responses[str(status)] = answer
        operation: dict[str, Any] = {
            "summary": route.summary,
            "operationId": route.handler.__name__.strip("_"),
            "responses": responses,
        }
        if route.query:
            operation["parameters"] = [
                {
                    "name": p.name,
                    "in": "query",
                    "required": p.required,
                    "description": p.description,
                    "schema": p.adapter.json_schema(),
                }
                for p in route.query
            ]
        if route.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": content(refs[(route.body, "validation")]),
            }
        paths.setdefault(route.path, {})[route.method.lower()] = operation

    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": zeus.__version__},
        "paths": paths,
        "components": {"schemas": top.get("$defs", {})},
    }
    if bearer:
        doc["components"]["securitySchemes"] = {_BEARER: {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{_BEARER: []}]
    return doc


def pages(
    doc: dict[str, Any], title: str, openapi_url: str, docs_url: str, redoc_url: str
) -> dict[str, tuple[bytes, bytes]]:
    """Path -> (content type, body) of the document and of its Swagger UI and ReDoc pages."""
    import json

    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

    swagger = get_swagger_ui_html(openapi_url=openapi_url, title=f"{title} - Swagger UI")
    redoc = get_redoc_html(openapi_url=openapi_url, title=f"{title} - ReDoc")
    html = b"text/html; charset=utf-8"
    return {
        openapi_url: (b"application/json", json.dumps(doc).encode()),
        docs_url: (html, bytes(swagger.body)),
        redoc_url: (html, bytes(redoc.body)),
    }
