"""JobSession's power-limit profiling when iterations are too short for the energy counter:
windows are measured again over more iterations, or, when an epoch cannot hold one, it says so
once; it never crashes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
import zeus.device.sim
from zeus.run import JobSession

COUNTER_PERIOD_S = 0.1  # the simulated A40 publishes energy every 100 ms at real fidelity


@pytest.fixture
def calibrated_a40(
    sim_gpus: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> dict[int, float]:
    """A simulated A40 at real fidelity; returns its seconds per unit of work by limit (mW)."""
    sim_gpus("A40", fidelity="real")
    monkeypatch.setenv("ZEUS_TARGET_METRIC", "0.5")
    monkeypatch.setenv("ZEUS_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("ZEUS_PROFILE_PARAMS", "1,4")
    return {int(pl) * 1000: seconds for pl, seconds, _ in zeus.device.sim.workload_points(0)}


def train_until_profiled(session: JobSession, work: float, epochs: int) -> None:
    """Train epochs of `work`-sized iterations (no eval) until profiling ends or epochs do."""
    for epoch in session.epochs():
        session.begin_epoch("train")
        for _ in range(session.train_iters):
            session.before_train_iteration()
            zeus.device.sim.run(work, [0])
        session.end_epoch("train")
        session.report_metric(0.0, higher_is_better=True)
        if not session.profiling or epoch + 1 >= epochs:
            return


def session_warnings(recwarn: pytest.WarningsRecorder, needle: str) -> list[str]:
    return [
        str(w.message)
        for w in recwarn
        if "[JobSession]" in str(w.message) and needle in str(w.message)
    ]


def test_short_iterations_are_profiled_over_longer_windows(
    calibrated_a40: dict[int, float], tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    work = 0.002  # 2 ms per iteration at 300 W: 4 measured iterations read 0 J
    session = JobSession(64, max_epochs=40, train_iters=400)
    train_until_profiled(session, work, epochs=40)
    assert not session.profiling

    [warning] = session_warnings(recwarn, "The profiling window")
    assert "is unreliable" in warning and "ZEUS_PROFILE_PARAMS" in warning
    assert f"{COUNTER_PERIOD_S:g} s" in warning
    power = json.loads((tmp_path / "logs" / "bs64.power.json").read_text())
    assert sorted(int(pl) for pl in power["train_throughput"]) == sorted(calibrated_a40)
    for pl, throughput in power["train_throughput"].items():
        # Iterations per second at that limit, whatever the window's length was.
        assert throughput == pytest.approx(1 / (work * calibrated_a40[int(pl)]), rel=1e-5)
        assert power["train_power"][pl] > 0
    assert power["optimal_pl"] in calibrated_a40


def test_epochs_too_short_for_a_trustworthy_window_say_so_once(
    calibrated_a40: dict[int, float], recwarn: pytest.WarningsRecorder
) -> None:
    session = JobSession(64, max_epochs=8, train_iters=16)
    train_until_profiled(session, 0.002, epochs=8)
    assert session.profiling  # no window of 16 iterations can measure energy here

    [warning] = session_warnings(recwarn, "too short to profile")
    assert "Epochs of 16 steps" in warning and "more than an epoch holds" in warning
    assert len(session_warnings(recwarn, "The profiling window")) == 1
