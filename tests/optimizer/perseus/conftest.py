"""Fixtures for the Perseus tests: an isolated GPU settings journal."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def journal_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Journal into the test's directory (`$ZEUS_STATE_DIR`), never the user's state dir."""
    state = tmp_path / "zeus-state"
    monkeypatch.setenv("ZEUS_STATE_DIR", str(state))
    return state
