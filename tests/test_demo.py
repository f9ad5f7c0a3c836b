"""`python -m zeus.demo` on the simulated GPU: its power-limit table cannot be inverted by load."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_demo_times_power_limits_on_the_simulators_clock(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEUS_SIM_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO / "python"), env.get("PYTHONPATH", "")]),
        ZEUS_GPU_BACKEND="sim",
        ZEUS_SIM_GPUS="A40",
        ZEUS_STATE_DIR=str(tmp_path / "state"),
        COLUMNS="120",
    )
    out = subprocess.run(
        [sys.executable, "-m", "zeus.demo", "--seconds", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "virtual clock" in out.stdout, out.stdout
    rows = re.findall(r"│\s*(\d+)\s*│\s*([\d.]+)\s*│\s*([\d.]+)\s*│", out.stdout)
    times = {int(pl): float(t) for pl, _, t in rows}
    assert len(times) >= 5, out.stdout
    # A step never runs faster at a lower power limit: a busy machine's late wake-ups do
    # not reach the simulated GPU's clock. (On the real clock they did: "175 W: -10.8% time".)
    by_limit = [times[pl] for pl in sorted(times, reverse=True)]
    assert by_limit == sorted(by_limit), times
    assert "chosen:" in out.stdout
