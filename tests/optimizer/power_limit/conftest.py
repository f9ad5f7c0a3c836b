"""Fixtures for the power-limit optimizer tests: an isolated journal directory, a spy on power
limit changes, and the measured profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from zeus.device import settings
from zeus.optimizer.power_limit import optimizer


@pytest.fixture(autouse=True)
def _isolated_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Journal into the test's directory; restore every optimizer the test left active."""
    state = tmp_path / "zeus-state"
    monkeypatch.setenv("ZEUS_STATE_DIR", str(state))
    yield state
    settings.restore_all()


@pytest.fixture
def journal_dir(_isolated_journal: Path) -> Path:
    """The test's journal directory (`$ZEUS_STATE_DIR`)."""
    return _isolated_journal


class _RecordingGuard:
    """A settings guard that records every power limit set through it."""

    def __init__(self, guard: Any, calls: list[tuple[int, int]]) -> None:
        self._guard = guard
        self._calls = calls

    def set_power_limit(self, index: int, mw: int) -> None:
        self._calls.append((index, mw))
        self._guard.set_power_limit(index, mw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._guard, name)


@pytest.fixture
def set_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every power limit `(index, mW)` the optimizer sets, in order, still applied to the GPU."""
    calls: list[tuple[int, int]] = []
    real = optimizer.SettingsGuard

    def recording(*args: Any, **kwargs: Any) -> _RecordingGuard:
        return _RecordingGuard(real(*args, **kwargs), calls)

    monkeypatch.setattr(optimizer, "SettingsGuard", recording)
    return calls
