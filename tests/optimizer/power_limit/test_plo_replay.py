"""Port of zeus 0.8's replay test: the optimizer driven by measured ZeusMonitor logs.

For every profile, selector knob and epoch-interruption pattern, the exact sequence of power
limits set on every GPU is checked, then the saved profile is reloaded with other selectors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest
from plo_helpers import dedupe, load_profile, profile_params, zeus_cost_choice
from zeus.optimizer.power_limit import (
    Done,
    Energy,
    GlobalPowerLimitOptimizer,
    MaxSlowdownConstraint,
    Time,
    ZeusCost,
)
from zeus.util.testing import ReplayZeusMonitor

WAIT, WARMUP, PROFILE = 1, 10, 40
CYCLE = WARMUP + PROFILE

# Epoch lengths after the first (which is `WAIT` steps longer so the arithmetic matches):
# never interrupted; ends 5 steps into a warmup; 20 steps into a measurement; right after the
# last measured step (before the step that would close the window).
PATTERNS: dict[str, int | None] = {
    "never": None,
    "warmup": CYCLE + WARMUP // 2,
    "profiling": CYCLE + WARMUP + PROFILE // 2,
    "last_profiling_step": CYCLE + CYCLE,
}


def drive(plo: GlobalPowerLimitOptimizer, epoch_len: int | None, max_epochs: int = 50) -> None:
    """A training loop calling every hook, until the optimizer is done."""
    for epoch in range(max_epochs):
        steps = 10_000 if epoch_len is None else epoch_len + (WAIT if epoch == 0 else 0)
        plo.on_epoch_begin()
        for _ in range(steps):
            plo.on_step_begin()
            plo.on_step_end()
        plo.on_epoch_end()
        if isinstance(plo.state, Done):
            return
    raise AssertionError(f"not done after {max_epochs} epochs: {plo.state}")


def expected_sequence(pls_w: list[int], optimal_w: int, interrupted: bool) -> list[int]:
    """Max first; each limit after the first is interrupted once and retried; then the optimum."""
    top = pls_w[0]
    raw = [top, pls_w[0]]
    for pl in pls_w[1:]:
        raw += [pl, top, pl] if interrupted else [pl]
    raw.append(optimal_w)
    return [w * 1000 for w in dedupe(raw)]


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("eta", [0.0, 0.25, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("path", profile_params())
def test_replay(
    path: Path,
    eta: float,
    pattern: str,
    tmp_path: Path,
    sim_gpus: Callable[..., object],
    set_calls: list[tuple[int, int]],
) -> None:
    prof = load_profile(path)
    n = len(prof.gpu_indices)
    sim_gpus(",".join([prof.model] * n))
    monitor = ReplayZeusMonitor(log_file=path, ignore_sync_cuda=True, match_window_name=False)
    assert monitor.gpu_indices == prof.gpu_indices
    profile_file = tmp_path / "profile.json"

    plo = GlobalPowerLimitOptimizer(
        monitor,
        optimum_selector=ZeusCost(eta_knob=eta, world_size=n),
        wait_steps=WAIT,
        warmup_steps=WARMUP,
        profile_steps=PROFILE,
        pl_step=25,
        profile_path=profile_file,
    )
    drive(plo, PATTERNS[pattern])

    pls = [r[0] for r in prof.rows]
    assert plo.power_limits == [w * 1000 for w in pls]
    optimal = zeus_cost_choice(prof.rows, eta, n)
    assert plo.state == Done(optimal_power_limit=optimal * 1000)
    want = expected_sequence(pls, optimal, interrupted=pattern != "never")
    for gpu in prof.gpu_indices:
        assert [mw for i, mw in set_calls if i == gpu] == want, gpu
    assert {i for i, _ in set_calls} == set(prof.gpu_indices)

    # The profile on disk is the reference format and matches the log.
    saved = json.loads(profile_file.read_text())
    assert list(saved) == ["measurements"]
    assert [(m["power_limit"], m["energy"], m["time"]) for m in saved["measurements"]] == [
        pytest.approx(r) for r in prof.rows
    ]

    if eta != 0.5 or pattern != "never":
        return
    # Reloading the profile: no profiling, the optimum of the new selector is set at once.
    for selector, want_w in [
        (Energy(), min(prof.rows, key=lambda r: r[1])[0]),
        (Time(), min(prof.rows, key=lambda r: r[2])[0]),
        *[
            (
                MaxSlowdownConstraint(f),
                min(pl for pl, _, t in prof.rows if t <= f * prof.rows[0][2]),
            )
            for f in (1.0, 1.1, 1.2, 1.5, 100.0)
        ],
    ]:
        set_calls.clear()
        again = GlobalPowerLimitOptimizer(
            monitor, optimum_selector=selector, profile_path=profile_file
        )
        assert again.state == Done(optimal_power_limit=want_w * 1000)
        assert [mw for i, mw in set_calls if i == prof.gpu_indices[0]][-1:] in (
            [want_w * 1000],
            [],  # already in force
        )
        for i in prof.gpu_indices:
            assert again.gpus.get_power_management_limit(i) == want_w * 1000
