"""The vocabulary of the server's route table: `Route`, `QueryParam` and `Handler`.

Its own module so that both the dispatcher (`app.py`, which holds the table) and the OpenAPI
generator (`openapi.py`, which documents it) depend on it, and not on each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable, Optional

from pydantic import BaseModel, TypeAdapter

__all__ = ["Handler", "QueryParam", "Route"]

# A handler gets the service and the validated query values and body, in the route's order;
# it returns the status and the answer's model (None answers JSON null).
Handler = Callable[..., Awaitable[tuple[int, Optional[BaseModel]]]]


@dataclass(frozen=True)
class QueryParam:
    """A query parameter, validated with `adapter`; an optional one absent is None."""

    name: str
    adapter: TypeAdapter
    description: str
    required: bool = True


@dataclass(frozen=True)
class Route:
    """One endpoint: how it is served, and how `openapi.py` documents it.

    Attributes:
        method: HTTP method.
        path: URL path.
        handler: The coroutine that answers it (see `Handler`).
        summary: One line for the documentation.
        query: Its query parameters.
        body: The model of its JSON body, if it has one.
        answers: Success status -> (model of the answer or None for null, description).
        errors: The error statuses it may answer (401 is added when a token is configured).

    """

    method: str
    path: str
    handler: Handler
    summary: str
    query: tuple[QueryParam, ...] = ()
    body: Optional[type[BaseModel]] = None
    answers: tuple[tuple[int, Optional[type[BaseModel]], str], ...] = ()
    errors: tuple[int, ...] = ()

    @property
    def where(self) -> str:
        """The part of the request whose fields the service's errors are about."""
        return "body" if self.body is not None else "query"
