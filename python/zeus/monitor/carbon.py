"""Carbon emission of code windows: window energy weighted by the grid's carbon intensity.

`CarbonEmissionMonitor` (Zeus 0.16's API) measures windows as `ZeusMonitor` does and splits
each window's energy by the periods of its carbon-intensity feed (hours, for ElectricityMaps),
so a window that runs from a coal-heavy evening into a windy night is charged each hour's
intensity for the energy of that hour:

```python
from zeus.monitor.carbon import CarbonEmissionMonitor, ElectricityMapsClient

provider = ElectricityMapsClient(location=(42.28, -83.74), estimate=True)
monitor = CarbonEmissionMonitor(provider, gpu_indices=[0])
monitor.begin_window("training")
...
m = monitor.end_window("training")
m.gpu_energy[0], m.gpu_carbon_emission[0]  # J, gCO2eq
```

How the split works: while any window is open, one thread (not a process, as in the
reference) wakes at each period boundary and cuts every open window's running slice there;
slices are windows of an internal `ZeusMonitor`, so cutting costs microseconds. The thread
fetches the intensity of the period that just ended, so a window longer than the feed's
history (24 hours for ElectricityMaps) still has every hour's value. `end_window` fetches the
current period's value (once per period). Each device's emission is its window energy times
the slices' intensities weighted by that device's slice energies.

Units: energy in J, intensity in gCO2eq/kWh, emission in gCO2eq.
"""

from __future__ import annotations

import abc
import itertools
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, Optional

import httpx

from zeus.exception import ZeusBaseError
from zeus.monitor.energy import Measurement, ZeusMonitor
from zeus.util.framework import SyncWith

__all__ = [
    "CarbonEmissionMeasurement",
    "CarbonEmissionMonitor",
    "CarbonIntensityProvider",
    "ElectricityMapsClient",
    "ElectrictyMapsClient",
    "ZeusCarbonIntensityHTTPError",
    "ZeusCarbonIntensityNotFoundError",
    "get_ip_lat_long",
]

logger = logging.getLogger(__name__)

JOULES_PER_KWH = 3.6e6
API_KEY_VAR = "ELECTRICITYMAPS_API_KEY"
SLICE_PREFIX = "__zeus_carbon_slice"

class ZeusCarbonIntensityHTTPError(ZeusBaseError):
    """The carbon-intensity service could not be reached or answered with an error status."""


class ZeusCarbonIntensityNotFoundError(ZeusBaseError):
    """The service answered, but without the carbon intensity asked for.

    Attributes:
        measurement: When raised by `CarbonEmissionMonitor.end_window`, the window's energy
            `Measurement` (the window is closed; its energy is not lost). Otherwise None.

    """

    def __init__(self, message: str, measurement: Optional[Measurement] = None) -> None:
        super().__init__(message)
        self.measurement = measurement


def get_ip_lat_long(
    url: str = "https://ipinfo.io/json", timeout: float = 10.0
) -> tuple[float, float]:
    """Latitude and longitude of this machine's public IP address, from ipinfo.io.

    Raises:
        ZeusCarbonIntensityHTTPError: the service is unreachable, or its answer has no `loc`.

    """
    try:
        resp = httpx.get(url, timeout=timeout)
        resp.raise_for_status()
        lat, lon = (float(x) for x in resp.json()["loc"].split(","))
    except (httpx.HTTPError, ValueError, KeyError, AttributeError) as e:
        raise ZeusCarbonIntensityHTTPError(
            f"Cannot tell this machine's location from {url}: {type(e).__name__}: {e}; pass "
            "the location (latitude, longitude) yourself"
        ) from e
    return lat, lon


class CarbonIntensityProvider(abc.ABC):
    """Where carbon intensity (gCO2eq/kWh) comes from."""

    @abc.abstractmethod
    def get_current_carbon_intensity(self) -> float:
        """The intensity of the current period."""

    @abc.abstractmethod
    def get_recent_carbon_intensity(self) -> dict[datetime, float]:
        """Recent intensities by the (timezone-aware) start of their period."""

    @property
    @abc.abstractmethod
    def update_period(self) -> timedelta:
        """How long one intensity value holds.

        Periods start at multiples of it from the UNIX epoch (whole hours for an hour).
        """

    @property
    @abc.abstractmethod
    def history_length(self) -> int:
        """How many periods `get_recent_carbon_intensity` covers."""


class ElectricityMapsClient(CarbonIntensityProvider):
    """Carbon intensity of a location from the ElectricityMaps API (hourly values).

    Args:
        location: (latitude, longitude).
        estimate: Accept estimated values where measured ones are missing (needed in many
            zones for the latest hour).
        emission_factor_type: `"direct"` (combustion) or `"lifecycle"` emission factors.
        api_key: The API token, sent as the `auth-token` header; None reads
            `ELECTRICITYMAPS_API_KEY` (the reference sends none, which only the free
            endpoints of some zones accept).
        base_url: The API's root, up to and including its version.
        timeout: Seconds to wait for an answer.

    """

    def __init__(
        self,
        location: tuple[float, float],
        estimate: bool = False,
        emission_factor_type: Literal["direct", "lifecycle"] = "direct",
        api_key: Optional[str] = None,
        base_url: str = "https://api.electricitymap.org/v3",
        timeout: float = 10.0,
    ) -> None:
        lat, lon = (float(x) for x in location)
        if not (-90 <= lat <= 90 and -180 <= lon <= 180):
            raise ValueError(f"location={location!r}: expected (latitude, longitude) in degrees")
        if emission_factor_type not in ("direct", "lifecycle"):
            raise ValueError(
                f"emission_factor_type={emission_factor_type!r}: expected 'direct' or 'lifecycle'"
            )
        self.lat, self.long = lat, lon
        self.estimate = bool(estimate)
        self.emission_factor_type = emission_factor_type
        self._api_key = api_key if api_key is not None else (os.environ.get(API_KEY_VAR) or None)
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def __repr__(self) -> str:
        return (
            f"ElectricityMapsClient(location=({self.lat}, {self.long}), estimate={self.estimate},"
            f" emission_factor_type={self.emission_factor_type!r})"
        )

    def get_current_carbon_intensity(self) -> float:
        """The latest intensity, gCO2eq/kWh.

        Raises:
            ZeusCarbonIntensityHTTPError: the API is unreachable or answered with an error.
            ZeusCarbonIntensityNotFoundError: the answer holds no intensity.

        """
        body = self._get("latest")
        value = body.get("carbonIntensity") if isinstance(body, dict) else None
        if not isinstance(value, (int, float)):
            raise ZeusCarbonIntensityNotFoundError(
                f"ElectricityMaps has no current carbon intensity at {self._where()}: "
                f"{str(body)[:300]}"
            )
        return float(value)

    def get_recent_carbon_intensity(self) -> dict[datetime, float]:
        """The last 24 hours' intensities by the start of their hour, gCO2eq/kWh.

        Hours without a value (null in the answer) are left out.

        Raises:
            ZeusCarbonIntensityHTTPError: the API is unreachable or answered with an error.
            ZeusCarbonIntensityNotFoundError: the answer holds no history.

        """
        body = self._get("history")
        history = body.get("history") if isinstance(body, dict) else None
        if not isinstance(history, list):
            raise ZeusCarbonIntensityNotFoundError(
                f"ElectricityMaps has no carbon-intensity history at {self._where()}: "
                f"{str(body)[:300]}"
            )
        out = {}
        for entry in history:
            value = entry.get("carbonIntensity")
            if isinstance(value, (int, float)) and "datetime" in entry:
                out[_parse_time(entry["datetime"])] = float(value)
        return out

    @property
    def update_period(self) -> timedelta:
        """One hour."""
        return timedelta(hours=1)

    @property
    def history_length(self) -> int:
        """24 (hours)."""
        return 24

    def _where(self) -> str:
        return (
            f"({self.lat}, {self.long}) with estimate={self.estimate} and "
            f"emission_factor_type={self.emission_factor_type!r}"
        )

    def _get(self, what: str) -> Any:
        url = f"{self.base_url}/carbon-intensity/{what}"
        params = {
            "lat": str(self.lat),
            "lon": str(self.long),
            "disableEstimations": str(not self.estimate).lower(),
            "emissionFactorType": self.emission_factor_type,
        }
        headers = {"auth-token": self._api_key} if self._api_key else {}
        try:
            resp = httpx.get(url, params=params, headers=headers, timeout=self.timeout)
        except httpx.HTTPError as e:
            raise ZeusCarbonIntensityHTTPError(
                f"Cannot reach ElectricityMaps at {url}: {type(e).__name__}: {e}"
            ) from e
        if resp.status_code != 200:
            hint = ""
            if resp.status_code in (401, 403) and not self._api_key:
                hint = f" (no API key was sent: set {API_KEY_VAR} or pass api_key)"
            raise ZeusCarbonIntensityHTTPError(
                f"ElectricityMaps {url} answered HTTP {resp.status_code}{hint}: "
                f"{resp.text.strip()[:300]}"
            )
        try:
            return resp.json()
        except ValueError as e:
            raise ZeusCarbonIntensityNotFoundError(
                f"ElectricityMaps {url} answered with non-JSON: {resp.text[:200]!r}"
            ) from e


ElectrictyMapsClient = ElectricityMapsClient
"""The reference's spelling."""


def _parse_time(text: str) -> datetime:
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


@dataclass
class CarbonEmissionMeasurement:
    """Time, energy and carbon emission of one window.

    Attributes:
        time: Seconds.
        gpu_energy: J by GPU index (framework indices, after `CUDA_VISIBLE_DEVICES`).
        gpu_carbon_emission: gCO2eq by GPU index.
        cpu_energy: J by CPU package, or None when no CPU is measured.
        cpu_carbon_emission: gCO2eq by CPU package, or None.
        dram_energy: J by CPU package with DRAM, or None.
        dram_carbon_emission: gCO2eq by CPU package with DRAM, or None.

    """

    time: float
    gpu_energy: dict[int, float]
    gpu_carbon_emission: dict[int, float]
    cpu_energy: Optional[dict[int, float]] = None
    cpu_carbon_emission: Optional[dict[int, float]] = None
    dram_energy: Optional[dict[int, float]] = None
    dram_carbon_emission: Optional[dict[int, float]] = None


def weighted_emission(
    energy_j: float, slice_energies_j: Sequence[float], intensities: Sequence[float]
) -> float:
    """Emission (gCO2eq) of `energy_j` at the slices' intensities (gCO2eq/kWh).

    The energy is spread over the slices as `slice_energies_j` spread: the slices only weigh
    the intensities, the emission is of the window's own energy. Slices without energy (all
    zero) weigh equally.
    """
    if len(slice_energies_j) != len(intensities) or not intensities:
        raise ValueError("one intensity per slice, and at least one slice")
    total = sum(slice_energies_j)
    if total > 0:
        mean = sum(e / total * i for e, i in zip(slice_energies_j, intensities))
    else:
        mean = sum(intensities) / len(intensities)
    return energy_j / JOULES_PER_KWH * mean


@dataclass
class _Window:
    """An open window: its finished slices (period start, measurement) and the running one."""

    slices: list[tuple[datetime, Measurement]] = field(default_factory=list)
    running: str = ""
    period: datetime = datetime.min.replace(tzinfo=timezone.utc)


class CarbonEmissionMonitor:
    """Measure time, energy and carbon emission of code windows (Zeus 0.16's API).

    Args:
        carbon_intensity_provider: Where intensities come from (`ElectricityMapsClient`).
        gpu_indices: GPUs to measure, as in `ZeusMonitor` (all visible when None).
        cpu_indices: CPU packages to measure, as in `ZeusMonitor` (none when None).
        sync_execution_with: The framework a window sync waits for, as in `ZeusMonitor`.

    Raises:
        ValueError: as `ZeusMonitor`, or the provider's `update_period` is not positive.

    """

    def __init__(
        self,
        carbon_intensity_provider: CarbonIntensityProvider,
        gpu_indices: Optional[list[int]] = None,
        cpu_indices: Optional[list[int]] = None,
        sync_execution_with: Optional[SyncWith] = None,
    ) -> None:
        self.carbon_intensity_provider = carbon_intensity_provider
        self._period = carbon_intensity_provider.update_period
        if self._period <= timedelta(0):
            raise ValueError(f"the provider's update_period {self._period} is not positive")
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
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._windows: dict[str, _Window] = {}
        self._intensity: dict[datetime, float] = {}  # by period start
        self._names = itertools.count()
        self._cutter: Optional[threading.Thread] = None

    @property
    def gpu_indices(self) -> list[int]:
        """The measured GPUs."""
        return self.zeus_monitor.gpu_indices

    @property
    def cpu_indices(self) -> Optional[list[int]]:
        """The measured CPU packages, or None."""
        return self.zeus_monitor.cpu_indices

    def begin_window(self, key: str, sync_execution: bool = True) -> None:
        """Open window `key`.

        Raises:
            ValueError: a window named `key` is already open.

        """
        with self._lock:
            if key in self._windows:
                raise ValueError(f"Measurement window '{key}' already exists")
            self.zeus_monitor.begin_window(key, sync_execution=sync_execution)
            window = _Window()
            try:
                self._start_slice(window, self._period_start(datetime.now(timezone.utc)))
            except BaseException:
                self.zeus_monitor.end_window(key, sync_execution=False, cancel=True)
                raise
            self._windows[key] = window
            if self._cutter is None:
                self._cutter = threading.Thread(
                    target=self._cut_at_boundaries, name="zeus-carbon-slicer", daemon=True
                )
                self._cutter.start()

    def end_window(self, key: str, sync_execution: bool = True) -> CarbonEmissionMeasurement:
        """Close window `key` and return its time, energy and emission.

        Raises:
            ValueError: no window named `key` is open.
            ZeusCarbonIntensityHTTPError: the provider could not be reached for an intensity
                the window needs (the window stays open: call again).
            ZeusCarbonIntensityNotFoundError: the provider has no intensity for a period of
                the window; the window is closed and the error's `measurement` holds its
                energy.

        """
        with self._lock:
            if key not in self._windows:
                raise ValueError(f"Measurement window '{key}' does not exist")
            window = self._windows[key]
            periods = {p for p, _ in window.slices} | {window.period}
        # Fetched before closing anything, and outside the lock so that a slow provider does
        # not hold up the slicer: an unreachable provider leaves the window open.
        self._fetch_intensities(periods)
        with self._lock:
            m = self.zeus_monitor.end_window(key, sync_execution=sync_execution)
            slices = [*window.slices, (window.period, self._slices.end_window(window.running))]
            del self._windows[key]
            self._wake.notify_all()
        try:  # A boundary passed meanwhile: its period is new.
            self._fetch_intensities({p for p, _ in slices})
        except ZeusBaseError as e:
            logger.warning("carbon intensity of window '%s' not complete: %s", key, e)
        intensities = [self._intensity.get(p) for p, _ in slices]
        missing = sorted(p for (p, _), i in zip(slices, intensities) if i is None)
        if missing:
            raise ZeusCarbonIntensityNotFoundError(
                f"No carbon intensity for the period(s) starting "
                f"{', '.join(p.isoformat() for p in missing)} of window '{key}'",
                measurement=m,
            )
        values = [float(i) for i in intensities if i is not None]

        def emission(energy: Mapping[int, float], part: str) -> dict[int, float]:
            return {
                k: weighted_emission(e, [getattr(s, part)[k] for _, s in slices], values)
                for k, e in energy.items()
            }

        return CarbonEmissionMeasurement(
            time=m.time,
            gpu_energy=dict(m.gpu_energy),
            gpu_carbon_emission=emission(m.gpu_energy, "gpu_energy"),
            cpu_energy=None if m.cpu_energy is None else dict(m.cpu_energy),
            cpu_carbon_emission=None
            if m.cpu_energy is None
            else emission(m.cpu_energy, "cpu_energy"),
            dram_energy=None if m.dram_energy is None else dict(m.dram_energy),
            dram_carbon_emission=(
                None if m.dram_energy is None else emission(m.dram_energy, "dram_energy")
            ),
        )

    # Inside.

    def _period_start(self, t: datetime) -> datetime:
        epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
        return epoch + ((t - epoch) // self._period) * self._period

    def _start_slice(self, window: _Window, period: datetime) -> None:
        window.running = f"{SLICE_PREFIX}_{next(self._names)}"
        window.period = period
        self._slices.begin_window(window.running, sync_execution=False)

    def _cut_at_boundaries(self) -> None:
        """The slicer thread: at each period boundary, cut every open window's slice there."""
        while True:
            with self._lock:
                if not self._windows:
                    self._cutter = None
                    return
                now = datetime.now(timezone.utc)
                boundary = self._period_start(now) + self._period
                self._wake.wait(timeout=(boundary - now).total_seconds())
                if datetime.now(timezone.utc) < boundary:
                    continue  # woken by a window ending, not by the boundary
                ended = set()
                for window in self._windows.values():
                    if window.period < boundary:
                        m = self._slices.end_window(window.running, sync_execution=False)
                        window.slices.append((window.period, m))
                        ended.add(window.period)
                        self._start_slice(window, self._period_start(datetime.now(timezone.utc)))
            # The periods just ended are in the provider's history now: fetch their values
            # while they are, so windows longer than the history keep them.
            try:
                self._fetch_intensities(ended)
            except ZeusBaseError as e:
                logger.warning("carbon intensity not fetched yet (%s); retrying later", e)

    def _fetch_intensities(self, periods: set[datetime]) -> None:
        """Fill `self._intensity` for `periods` not in it yet.

        Called without the lock: a second fetch of the same period by the other thread only
        writes the same value again.
        """
        needed = {p for p in periods if p not in self._intensity}
        if not needed:
            return
        current = self._period_start(datetime.now(timezone.utc))
        provider = self.carbon_intensity_provider
        if current in needed:
            self._intensity[current] = provider.get_current_carbon_intensity()
            needed.discard(current)
        if needed:
            history = {
                self._period_start(t): v for t, v in provider.get_recent_carbon_intensity().items()
            }
            for p in needed:
                if p in history:
                    self._intensity[p] = history[p]
