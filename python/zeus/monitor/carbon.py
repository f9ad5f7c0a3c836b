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

How the split works (`zeus.monitor.periods`): while any window is open, one thread (not a
process, as in the reference) cuts every open window at each period boundary, and fetches
the intensity of the period that just ended, so a window longer than the feed's history (24
hours for ElectricityMaps) still has every hour's value. `end_window` fetches the
current period's value (once per period). Each device's emission is its window energy times
the slices' intensities weighted by that device's slice energies.

Units: energy in J, intensity in gCO2eq/kWh, emission in gCO2eq.
"""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, Optional

from zeus.exception import ZeusBaseError
from zeus.monitor.energy import Measurement
from zeus.monitor.periods import PeriodWindows, charged_fields
from zeus.util import http
from zeus.util.framework import SyncWith

# Defined with `get_ip_lat_long` (Zeus 0.16's `zeus.utils.lat_lon`), which raises it too.
from zeus.util.lat_lon import ZeusCarbonIntensityHTTPError, check_location, get_ip_lat_long

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

API_KEY_VAR = "ELECTRICITYMAPS_API_KEY"


class ZeusCarbonIntensityNotFoundError(ZeusBaseError):
    """The service answered, but without the carbon intensity asked for.

    Attributes:
        measurement: When raised by `CarbonEmissionMonitor.end_window`, the window's energy
            `Measurement` (the window is closed; its energy is not lost). Otherwise None.

    """

    def __init__(self, message: str, measurement: Optional[Measurement] = None) -> None:
        super().__init__(message)
        self.measurement = measurement


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
        lat, lon = check_location(location)
        if emission_factor_type not in ("direct", "lifecycle"):
            raise ValueError(
                f"emission_factor_type={emission_factor_type!r}: expected 'direct' or 'lifecycle'"
            )
        self.lat, self.long = lat, lon
        self.estimate = bool(estimate)
        self.emission_factor_type = emission_factor_type
        self._api_key = http.lookup_token(api_key, API_KEY_VAR)
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # One value an hour: a failed request is not repeated, the next hour's fetch or the
        # caller's next `end_window` asks again.
        self._service = http.Service(
            "ElectricityMaps",
            http.ErrorMap(
                transport=self._unreachable,
                status=self._refused,
                body=self._not_json,
                success=(200,),
            ),
        )

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
        # ElectricityMaps' own header, not a bearer token.
        headers = {"auth-token": self._api_key} if self._api_key else {}
        with http.open_client(timeout=self.timeout) as client:
            return self._service.send_json(client, "GET", url, params=params, headers=headers)

    def _unreachable(self, failure: http.Failure) -> ZeusCarbonIntensityHTTPError:
        return ZeusCarbonIntensityHTTPError(
            f"Cannot reach ElectricityMaps at {failure.url}: "
            f"{type(failure.error).__name__}: {failure.error}"
        )

    def _refused(self, failure: http.Failure) -> ZeusCarbonIntensityHTTPError:
        hint = ""
        if failure.status in (401, 403) and not self._api_key:
            hint = f" (no API key was sent: set {API_KEY_VAR} or pass api_key)"
        return ZeusCarbonIntensityHTTPError(
            f"ElectricityMaps {failure.url} answered HTTP {failure.status}{hint}: "
            f"{failure.text.strip()[:300]}"
        )

    @staticmethod
    def _not_json(failure: http.Failure) -> ZeusCarbonIntensityNotFoundError:
        return ZeusCarbonIntensityNotFoundError(
            f"ElectricityMaps {failure.url} answered with non-JSON: {failure.text[:200]!r}"
        )


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


class CarbonEmissionMonitor(PeriodWindows):
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
        self._intensity: dict[datetime, float] = {}  # by period start
        super().__init__(
            carbon_intensity_provider.update_period,
            gpu_indices,
            cpu_indices,
            sync_execution_with,
            on_periods_ended=self._fetch_intensities,
        )

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
        # Fetched before closing anything: an unreachable provider leaves the window open.
        self._fetch_intensities(self.periods(key))
        m, slices = self._close(key, sync_execution)
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

        return CarbonEmissionMeasurement(**charged_fields(m, slices, values, "carbon_emission"))

    def _fetch_intensities(self, periods: set[datetime]) -> None:
        """Fill `self._intensity` for `periods` not in it yet.

        Both the caller's thread and the slicer call it, without a lock: a second fetch of the
        same period only writes the same value again.
        """
        needed = {p for p in periods if p not in self._intensity}
        if not needed:
            return
        current = self.period_start(datetime.now(timezone.utc))
        provider = self.carbon_intensity_provider
        if current in needed:
            self._intensity[current] = provider.get_current_carbon_intensity()
            needed.discard(current)
        if needed:
            recent = provider.get_recent_carbon_intensity()
            history = {self.period_start(t): v for t, v in recent.items()}
            for p in needed:
                if p in history:
                    self._intensity[p] = history[p]
