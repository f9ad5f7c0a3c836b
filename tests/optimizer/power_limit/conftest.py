"""Fixtures for the power-limit optimizer tests: an isolated journal directory, a spy on power
limit changes, and the measured profiles."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from zeus.device.gpu import GPUs
from zeus.optimizer.power_limit import guard


@pytest.fixture(autouse=True)
def _isolated_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Journal into the test's directory; restore every optimizer the test left active."""
    state = tmp_path / "zeus-state"
    monkeypatch.setenv("ZEUS_STATE_DIR", str(state))
    yield state
    guard.restore_all()


@pytest.fixture
def journal_dir(_isolated_journal: Path) -> Path:
    """The test's journal directory (`$ZEUS_STATE_DIR`)."""
    return _isolated_journal


@pytest.fixture
def set_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every `set_power_management_limit(index, mW)` call, in order, still applied to the GPU."""
    calls: list[tuple[int, int]] = []
    original = GPUs.set_power_management_limit

    def spy(self: GPUs, index: int, mw: int, block: bool = True) -> None:
        calls.append((index, mw))
        original(self, index, mw, block)

    monkeypatch.setattr(GPUs, "set_power_management_limit", spy)
    return calls
