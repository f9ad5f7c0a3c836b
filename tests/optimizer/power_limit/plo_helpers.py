"""Helpers shared by the power-limit optimizer tests (plain Python, independent of zeus)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data"
PROFILE_DIR = SHARED_DATA / "power-limit-profiles"
TRACE_DIR = SHARED_DATA / "zeus-traces"


@dataclass
class Profile:
    """One measured power-limit profile (a ZeusMonitor log, one window per power limit)."""

    path: Path
    model: str
    gpu_indices: list[int]
    # (power limit W, total energy J over the GPUs, time s), in file (profiling) order.
    rows: list[tuple[int, float, float]]


def load_profile(path: Path) -> Profile:
    """Parse a profile CSV with the csv module only (independent of the code under test)."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        gpus = [int(c[len("gpu") : -len("_energy")]) for c in header[3:]]
        rows = []
        for r in reader:
            pl = int(r[1].rsplit("_", 1)[1])
            rows.append((pl, sum(float(x) for x in r[3:]), float(r[2])))
    return Profile(path, path.name.split("+")[0], gpus, rows)


def profile_params() -> list[object]:
    """One pytest parameter per profile CSV; a single skipped one when the data is absent."""
    paths = sorted(PROFILE_DIR.glob("*.csv")) if PROFILE_DIR.is_dir() else []
    if not paths:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{PROFILE_DIR} is absent"))]
    return [pytest.param(p, id=p.stem) for p in paths]


def dedupe(seq: list[int]) -> list[int]:
    """Drop consecutive repeats (the optimizer skips setting the limit already in force)."""
    out: list[int] = []
    for x in seq:
        if not out or out[-1] != x:
            out.append(x)
    return out


def zeus_cost_choice(rows: list[tuple[int, float, float]], eta: float, world_size: int) -> int:
    """Argmin of eta*E + (1-eta)*maxPL*world_size*T, first in profiling order on ties."""
    max_power = max(r[0] for r in rows) * world_size
    best = None
    for pl, e, t in rows:
        cost = eta * e + (1 - eta) * max_power * t
        if best is None or cost < best[1]:
            best = (pl, cost)
    assert best is not None
    return best[0]


class WindowMonitor:
    """A minimal monitor over the GPUs object (time from `gpus.now()`, energy counters).

    Keeps these tests independent of `zeus.monitor`, which is developed separately.
    """

    def __init__(self, gpus: object, gpu_indices: list[int]) -> None:
        self.gpus = gpus
        self.gpu_indices = list(gpu_indices)
        self.windows: dict[str, tuple[float, dict[int, int]]] = {}
        self.log: list[tuple[str, float, float]] = []

    def _energy(self) -> dict[int, int]:
        return {i: self.gpus.get_total_energy_consumption(i) for i in self.gpu_indices}  # type: ignore[attr-defined]

    def begin_window(self, key: str, sync_cuda: bool = True) -> None:
        assert key not in self.windows, key
        self.windows[key] = (self.gpus.now(), self._energy())  # type: ignore[attr-defined]

    def end_window(self, key: str, sync_cuda: bool = True, cancel: bool = False) -> Window:
        t0, e0 = self.windows.pop(key)
        t1, e1 = self.gpus.now(), self._energy()  # type: ignore[attr-defined]
        w = Window(t1 - t0, {i: (e1[i] - e0[i]) / 1000 for i in self.gpu_indices})
        if not cancel:
            self.log.append((key, w.time, w.total_energy))
        return w


@dataclass
class Window:
    """What `WindowMonitor.end_window` returns."""

    time: float
    energy: dict[int, float]

    @property
    def total_energy(self) -> float:
        return sum(self.energy.values())
