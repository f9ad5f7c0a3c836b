"""Measurement windows split at the boundaries of fixed periods.

The periods are the hours of a tariff or of a carbon-intensity feed: each period's energy is
charged that period's rate.

`PeriodWindows` measures windows as `ZeusMonitor` does and, while any window is open, has the
slicer thread (`zeus.monitor.slicer`, shared with every monitor that cuts windows in time) cut
each open window's running slice at every period boundary. A slice is a window of an internal
`ZeusMonitor`, cut with `cut_window`: the slices of a window add up to it, and a cut costs
microseconds. Used by `zeus.monitor.carbon` (gCO2eq/kWh per hour) and `zeus.monitor.price`
($/kWh per hour).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional

from zeus.monitor import slicer
from zeus.monitor.energy import Measurement, ZeusMonitor
from zeus.util.framework import SyncWith

__all__ = ["JOULES_PER_KWH", "PeriodWindows", "charge", "charged_fields"]

logger = logging.getLogger(__name__)

JOULES_PER_KWH = 3.6e6
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def charge(
    energy_j: float, slice_energies_j: Sequence[float], rates_per_kwh: Sequence[float]
) -> float:
    """`energy_j` charged at the slices' rates (per kWh), weighted by the slices' energies.

    The slices only weigh the rates: what is charged is the window's own energy. Slices
    without energy (all zero) weigh equally.

    Raises:
        ValueError: the two sequences differ in length or are empty.

    """
    if len(slice_energies_j) != len(rates_per_kwh) or not rates_per_kwh:
        raise ValueError("one rate per slice, and at least one slice")
    total = sum(slice_energies_j)
    if total > 0:
        mean = sum(e / total * r for e, r in zip(slice_energies_j, rates_per_kwh))
    else:
        mean = sum(rates_per_kwh) / len(rates_per_kwh)
    return energy_j / JOULES_PER_KWH * mean


def charged_fields(
    m: Measurement,
    slices: Sequence[tuple[datetime, Measurement]],
    rates: Sequence[float],
    name: str,
) -> dict[str, Any]:
    """The fields of a charged window's measurement.

    `time`, and for each part `gpu`, `cpu` and `dram` its `<part>_energy` and `<part>_<name>`:
    each device's energy `charge`d at the slices' `rates` (one per slice), None where the
    window has no such energy.
    """
    out: dict[str, Any] = {"time": m.time}
    for part in ("gpu", "cpu", "dram"):
        energy: Optional[Mapping[int, float]] = getattr(m, f"{part}_energy")
        out[f"{part}_energy"] = None if energy is None else dict(energy)
        out[f"{part}_{name}"] = (
            None
            if energy is None
            else {
                k: charge(e, [getattr(s, f"{part}_energy")[k] for _, s in slices], rates)
                for k, e in energy.items()
            }
        )
    return out


@dataclass
class _Window:
    """An open window: its finished slices, and the running one.

    Attributes:
        slices: (period start, measurement) of each finished slice.
        running: The internal window the running slice is cut from.
        period: The start of the running slice's period.

    """

    slices: list[tuple[datetime, Measurement]] = field(default_factory=list)
    running: str = ""
    period: datetime = EPOCH


class PeriodWindows:
    """Windows of a `ZeusMonitor` whose energy is also split at period boundaries.

    The base of the monitors that charge each period's energy a rate of that period: they
    open windows with `begin_window` and close them with `_close`.

    Args:
        period: The length of a period; periods start at multiples of it from the UNIX epoch
            (whole hours for an hour).
        gpu_indices: As in `ZeusMonitor`.
        cpu_indices: As in `ZeusMonitor`.
        sync_execution_with: As in `ZeusMonitor`.
        on_periods_ended: Called on a thread of its own, without any lock held, with the starts
            of the periods the slicer just closed (to fetch their rates while they are
            recent); its errors are logged.

    Raises:
        ValueError: `period` is not positive, or as `ZeusMonitor`.

    """

    def __init__(
        self,
        period: timedelta,
        gpu_indices: Optional[list[int]] = None,
        cpu_indices: Optional[list[int]] = None,
        sync_execution_with: Optional[SyncWith] = None,
        on_periods_ended: Optional[Callable[[set[datetime]], None]] = None,
    ) -> None:
        if period <= timedelta(0):
            raise ValueError(f"period {period} is not positive")
        self.period = period
        self.zeus_monitor = ZeusMonitor(
            gpu_indices=gpu_indices,
            cpu_indices=cpu_indices,
            sync_execution_with=sync_execution_with,
        )
        # Slices on their own monitor, whose names stay out of the caller's. Cut at period
        # boundaries, some are short: the short-window warning is for the caller's windows.
        self._slices = ZeusMonitor(
            gpu_indices=self.zeus_monitor.gpu_indices, cpu_indices=cpu_indices
        )
        self._slices._set_short_window_warnings(False)
        self._on_periods_ended = on_periods_ended
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}
        self._names = itertools.count()
        self._cuts: Optional[slicer.Schedule] = None

    @property
    def gpu_indices(self) -> list[int]:
        """The measured GPUs."""
        return self.zeus_monitor.gpu_indices

    @property
    def cpu_indices(self) -> Optional[list[int]]:
        """The measured CPU packages, or None."""
        return self.zeus_monitor.cpu_indices

    def period_start(self, t: datetime) -> datetime:
        """The start of the period holding `t` (timezone-aware)."""
        return EPOCH + ((t - EPOCH) // self.period) * self.period

    def begin_window(self, key: str, sync_execution: bool = True) -> None:
        """Open window `key`.

        Raises:
            ValueError: a window named `key` is already open.

        """
        with self._lock:
            if key in self._windows:
                raise ValueError(f"Measurement window '{key}' already exists")
            self.zeus_monitor.begin_window(key, sync_execution=sync_execution)
            window = _Window(running=f"__zeus_period_slice_{next(self._names)}")
            window.period = self.period_start(datetime.now(timezone.utc))
            try:
                self._slices.begin_window(window.running, sync_execution=False)
            except BaseException:
                self.zeus_monitor.end_window(key, sync_execution=False, cancel=True)
                raise
            self._windows[key] = window
            if self._cuts is None:
                self._cuts = slicer.every(
                    self.period.total_seconds(), self._cut_at_boundary, aligned=True
                )

    def periods(self, key: str) -> set[datetime]:
        """The starts of the periods window `key` has touched so far.

        Raises:
            ValueError: no window named `key` is open.

        """
        with self._lock:
            window = self._open(key)
            return {p for p, _ in window.slices} | {window.period}

    def _close(
        self, key: str, sync_execution: bool = True
    ) -> tuple[Measurement, list[tuple[datetime, Measurement]]]:
        """Close window `key`: its measurement, and its slices by the start of their period.

        Raises:
            ValueError: no window named `key` is open.

        """
        with self._lock:
            window = self._open(key)
            m = self.zeus_monitor.end_window(key, sync_execution=sync_execution)
            last = self._slices.end_window(window.running, sync_execution=False)
            del self._windows[key]
            if not self._windows and self._cuts is not None:
                self._cuts.cancel()
                self._cuts = None
        return m, [*window.slices, (window.period, last)]

    def _open(self, key: str) -> _Window:
        try:
            return self._windows[key]
        except KeyError:
            raise ValueError(f"Measurement window '{key}' does not exist") from None

    def _cut_at_boundary(self) -> None:
        """On the slicer thread, at a period boundary: cut every open window's slice there."""
        ended = set()
        with self._lock:
            boundary = self.period_start(datetime.now(timezone.utc))
            for window in self._windows.values():
                if window.period < boundary:
                    m = self._slices.cut_window(window.running)
                    window.slices.append((window.period, m))
                    ended.add(window.period)
                    window.period = boundary
        if ended and self._on_periods_ended is not None:
            # It fetches rates over the network: not on the thread every cut shares.
            threading.Thread(
                target=self._report_ended, args=(ended,), name="zeus-periods-ended", daemon=True
            ).start()

    def _report_ended(self, ended: set[datetime]) -> None:
        assert self._on_periods_ended is not None
        try:
            self._on_periods_ended(ended)
        except Exception as e:
            logger.warning("after the periods %s ended: %s", sorted(ended), e)
