"""Fixtures of the batch size optimizer tests (helpers live in `bso_helpers.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from bso_helpers import BACKENDS, Database, ServerProcess


@pytest.fixture
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A fresh database; parametrise with `backend` (indirect) or it is SQLite."""
    backend = getattr(request, "param", "sqlite")
    db = Database(backend, tmp_path)
    yield db
    db.close()


@pytest.fixture(scope="module", params=BACKENDS)
def shared_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, Database]]:
    """One server per backend for a whole module (tests use distinct job ids)."""
    db = Database(request.param, tmp_path_factory.mktemp(request.param))
    if request.param == "postgres":
        db.migrate()
    server = ServerProcess(db.url).start()
    yield server, db
    server.stop()
    db.close()
