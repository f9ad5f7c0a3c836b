"""Electricity cost of code windows: each hour's energy at that hour's tariff rate.

`EnergyCostMonitor` (Zeus 0.16's API) measures windows as `ZeusMonitor` does and charges each
hour's energy the rate a utility tariff sets for that hour (time-of-use rates differ by month,
weekday or weekend, and hour). `OpenEIClient` reads a tariff from the OpenEI Utility Rate
Database:

```python
from zeus.monitor.price import EnergyCostMonitor, OpenEIClient

tariff = OpenEIClient((37.77, -122.42), label="5a...", sector="Commercial")
monitor = EnergyCostMonitor(tariff, gpu_indices=[0])
monitor.begin_window("training")
...
m = monitor.end_window("training")
m.gpu_energy[0], m.gpu_energy_cost[0]  # J, in the tariff's currency (USD in OpenEI)
```

Decided here where the reference leaves it open or errs (its source is Zeus 0.16):
- Hours are the machine's local time, as tariff schedules are; the reference looks them up by
  UTC hour, which charges a Californian's 5 pm at the 1 am rate.
- The rate of an hour is the first tier's `rate` plus its `adj` (OpenEI's adjustment, part of
  what is billed); the reference leaves `adj` out.
- The API key comes from `api_key`, else `OPENEI_API_KEY`, else api.data.gov's public,
  rate-limited `DEMO_KEY` (with one warning); the reference ships a key of its own in its
  source. OpenEI's keys are api.data.gov keys, free at https://openei.org/services/api/signup/.
- The tariff is fetched once, at the first window's end, and kept.
"""

from __future__ import annotations

import abc
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Optional

from zeus.exception import ZeusBaseError
from zeus.monitor.energy import Measurement
from zeus.monitor.periods import PeriodWindows, charged_fields
from zeus.util import http
from zeus.util.framework import SyncWith
from zeus.util.lat_lon import check_location

__all__ = [
    "ElectricityPriceProvider",
    "EnergyCostMeasurement",
    "EnergyCostMonitor",
    "OpenEIClient",
    "ZeusElectricityPriceHTTPError",
    "ZeusElectricityPriceNotFoundError",
    "rate_at",
]

logger = logging.getLogger(__name__)

API_KEY_VAR = "OPENEI_API_KEY"
DEMO_KEY = "DEMO_KEY"
"""api.data.gov's public key (OpenEI's keys are api.data.gov keys): a few requests an hour per
IP address, used when neither `api_key` nor `OPENEI_API_KEY` gives one."""
SIGNUP_URL = "https://openei.org/services/api/signup/"


class ZeusElectricityPriceHTTPError(ZeusBaseError):
    """The price service could not be reached or answered with an error status."""


class ZeusElectricityPriceNotFoundError(ZeusBaseError):
    """The service answered, but without a usable tariff.

    Attributes:
        measurement: When raised by `EnergyCostMonitor.end_window` after the window closed,
            the window's energy `Measurement` (not lost). Otherwise None.

    """

    def __init__(self, message: str, measurement: Optional[Measurement] = None) -> None:
        super().__init__(message)
        self.measurement = measurement


class ElectricityPriceProvider(abc.ABC):
    """Where a tariff comes from.

    A provider implements `get_current_electricity_prices` (Zeus 0.16's name, the abstract
    method) or `get_current_electricity_price` (this package's earlier name); either name then
    answers, the one calling the other.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Let a provider written against the earlier name answer the 0.16 name too."""
        super().__init_subclass__(**kwargs)
        if (
            "get_current_electricity_price" in cls.__dict__
            and "get_current_electricity_prices" not in cls.__dict__
        ):
            cls.get_current_electricity_prices = _prices_from_price  # type: ignore[method-assign]

    @abc.abstractmethod
    def get_current_electricity_prices(self) -> dict[str, list[Any]]:
        """The tariff, in OpenEI's shapes (Zeus 0.16's method).

        Returns:
            `energy_rate_structure`: periods, each a list of tiers with `rate` and optional
            `adj`, per kWh. `energy_weekday_schedule` and `energy_weekend_schedule`: 12 months
            x 24 hours of period indices.

        """

    def get_current_electricity_price(self) -> dict[str, list[Any]]:
        """The tariff: this package's earlier name of `get_current_electricity_prices`."""
        return self.get_current_electricity_prices()


def _prices_from_price(self: ElectricityPriceProvider) -> dict[str, list[Any]]:
    """`get_current_electricity_prices` of a provider that implements the earlier name."""
    return self.get_current_electricity_price()


class OpenEIClient(ElectricityPriceProvider):
    """A tariff from the OpenEI Utility Rate Database (API version 7).

    Args:
        location: (latitude, longitude) to search utilities around.
        label: The tariff's OpenEI label (its unique id).
        sector: `"Residential"`, `"Commercial"`, `"Industrial"` or `"Lighting"`.
        radius: Search radius in miles around `location`.
        api_key: An OpenEI (api.data.gov) API key; None reads `OPENEI_API_KEY`, and when that
            is unset too, the public, rate-limited `DEMO_KEY` is used (one `UserWarning` says
            so). The key is never shown in `repr` or in messages.
        base_url: The API's root.
        timeout: Seconds to wait for an answer.

    Raises:
        ValueError: `location`, `sector`, `radius` or `api_key` is not usable (the message
            names the value; a key that is a string is never printed unless it is blank).

    """

    def __init__(
        self,
        location: tuple[float, float],
        label: str,
        sector: Literal["Residential", "Commercial", "Industrial", "Lighting"] = "Residential",
        radius: int = 0,
        api_key: Optional[str] = None,
        base_url: str = "https://api.openei.org",
        timeout: float = 30.0,
    ) -> None:
        lat, lon = check_location(location)
        if sector not in ("Residential", "Commercial", "Industrial", "Lighting"):
            raise ValueError(
                f"sector={sector!r}: expected Residential, Commercial, Industrial or Lighting"
            )
        if not isinstance(radius, int) or radius < 0:
            raise ValueError(f"radius={radius!r}: expected miles, an int >= 0")
        self.lat, self.long = lat, lon
        self.label = label
        self.sector = sector
        self.radius = radius
        if api_key is not None and not isinstance(api_key, str):
            raise ValueError(f"api_key: expected a string, not {type(api_key).__name__}")
        if api_key is not None and not api_key.strip():
            raise ValueError(f"api_key={api_key!r}: expected a key, or None to read {API_KEY_VAR}")
        key = http.lookup_token(api_key, API_KEY_VAR)
        if key is None:
            key = DEMO_KEY
            warnings.warn(
                f"OpenEIClient uses api.data.gov's public {DEMO_KEY}, which is rate-limited (a "
                f"few requests an hour per IP address); set {API_KEY_VAR} or pass api_key "
                f"(a free key: {SIGNUP_URL})",
                UserWarning,
                stacklevel=2,
            )
        self._api_key: str = key
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # Fetched once per monitor: a failed request is not repeated, the caller's next
        # `end_window` asks again.
        self._service = http.Service(
            "OpenEI",
            http.ErrorMap(
                transport=self._unreachable,
                status=self._refused,
                body=self._not_json,
                success=(200,),
            ),
        )

    def __repr__(self) -> str:
        return (
            f"OpenEIClient(location=({self.lat}, {self.long}), label={self.label!r}, "
            f"sector={self.sector!r}, radius={self.radius})"
        )

    def get_current_electricity_prices(self) -> dict[str, list[Any]]:
        """The tariff `label` (see `ElectricityPriceProvider`).

        Raises:
            ZeusElectricityPriceHTTPError: the API is unreachable or answered with an error
                (with the demo key, most likely its rate limit: the message says so).
            ZeusElectricityPriceNotFoundError: no tariff with this label near the location, or
                one without energy rates.

        """
        url = f"{self.base_url}/utility_rates"
        params = {
            "version": "7",
            "format": "json",
            "detail": "full",
            "api_key": self._api_key,
            "lat": str(self.lat),
            "lon": str(self.long),
            "radius": str(self.radius),
            "sector": self.sector,
        }
        with http.open_client(timeout=self.timeout) as client:
            body = self._service.send_json(client, "GET", url, params=params)
        if not isinstance(body, dict):
            raise ZeusElectricityPriceNotFoundError(_not_an_object(url))
        items = body.get("items", [])
        for item in items:
            if isinstance(item, dict) and item.get("label") == self.label:
                return _tariff(item, self.label)
        labels = [i.get("label") for i in items if isinstance(i, dict)][:10]
        raise ZeusElectricityPriceNotFoundError(
            f"No {self.sector} tariff labelled {self.label!r} within {self.radius} miles of "
            f"({self.lat}, {self.long}); OpenEI listed {labels}"
        )

    # The error map. The key is in the query string, which `Failure.url` leaves out; the
    # messages name neither the key nor, in a transport failure's text, the full URL.

    @staticmethod
    def _unreachable(failure: http.Failure) -> ZeusElectricityPriceHTTPError:
        return ZeusElectricityPriceHTTPError(
            f"Cannot reach OpenEI at {failure.url}: {type(failure.error).__name__}"
        )

    def _refused(self, failure: http.Failure) -> ZeusElectricityPriceHTTPError:
        text = failure.text.replace(self._api_key, "<key>")
        hint = ""
        if self._api_key == DEMO_KEY:
            hint = (
                f" (with the public, rate-limited {DEMO_KEY}: set {API_KEY_VAR} to a key of "
                f"your own, free at {SIGNUP_URL})"
            )
        return ZeusElectricityPriceHTTPError(
            f"OpenEI {failure.url} answered HTTP {failure.status}: {text.strip()[:300]}{hint}"
        )

    @staticmethod
    def _not_json(failure: http.Failure) -> ZeusElectricityPriceNotFoundError:
        return ZeusElectricityPriceNotFoundError(_not_an_object(failure.url))


def _not_an_object(url: str) -> str:
    return f"OpenEI {url} answered with something else than a JSON object"


def _tariff(item: Mapping[str, Any], label: str) -> dict[str, list[Any]]:
    keys = {
        "energy_rate_structure": "energyratestructure",
        "energy_weekday_schedule": "energyweekdayschedule",
        "energy_weekend_schedule": "energyweekendschedule",
    }
    missing = [v for v in keys.values() if not item.get(v)]
    if missing:
        raise ZeusElectricityPriceNotFoundError(
            f"The tariff {label!r} has no {', '.join(missing)} (not priced by energy)"
        )
    return {k: item[v] for k, v in keys.items()}


def rate_at(tariff: Mapping[str, list[Any]], local: datetime) -> float:
    """The rate per kWh of `tariff` at local time `local`: the first tier's `rate` plus `adj`.

    Raises:
        ZeusElectricityPriceNotFoundError: the tariff's schedule or structure has no entry for
            that month and hour.

    """
    weekend = local.weekday() >= 5
    schedule = tariff["energy_weekend_schedule" if weekend else "energy_weekday_schedule"]
    try:
        period = schedule[local.month - 1][local.hour]
        tier = tariff["energy_rate_structure"][period][0]
        return float(tier.get("rate", 0.0)) + float(tier.get("adj", 0.0))
    except (IndexError, KeyError, TypeError, ValueError) as e:
        raise ZeusElectricityPriceNotFoundError(
            f"The tariff has no rate for {local:%B} {'weekends' if weekend else 'weekdays'} at "
            f"{local.hour}:00 ({type(e).__name__}: {e})"
        ) from e


@dataclass
class EnergyCostMeasurement:
    """Time, energy and electricity cost of one window.

    Attributes:
        time: Seconds.
        gpu_energy: J by GPU index (framework indices, after `CUDA_VISIBLE_DEVICES`).
        gpu_energy_cost: Cost by GPU index, in the tariff's currency.
        cpu_energy: J by CPU package, or None when no CPU is measured.
        cpu_energy_cost: Cost by CPU package, or None.
        dram_energy: J by CPU package with DRAM, or None.
        dram_energy_cost: Cost by CPU package with DRAM, or None.

    """

    time: float
    gpu_energy: dict[int, float]
    gpu_energy_cost: dict[int, float]
    cpu_energy: Optional[dict[int, float]] = None
    cpu_energy_cost: Optional[dict[int, float]] = None
    dram_energy: Optional[dict[int, float]] = None
    dram_energy_cost: Optional[dict[int, float]] = None


class EnergyCostMonitor(PeriodWindows):
    """Measure time, energy and electricity cost of code windows (Zeus 0.16's API).

    Args:
        electricity_price_provider: Where the tariff comes from (`OpenEIClient`).
        gpu_indices: GPUs to measure, as in `ZeusMonitor` (all visible when None).
        cpu_indices: CPU packages to measure, as in `ZeusMonitor` (none when None).
        sync_execution_with: The framework a window sync waits for, as in `ZeusMonitor`.

    """

    def __init__(
        self,
        electricity_price_provider: ElectricityPriceProvider,
        gpu_indices: Optional[list[int]] = None,
        cpu_indices: Optional[list[int]] = None,
        sync_execution_with: Optional[SyncWith] = None,
    ) -> None:
        self.electricity_price_provider = electricity_price_provider
        self._tariff: Optional[dict[str, list[Any]]] = None
        super().__init__(timedelta(hours=1), gpu_indices, cpu_indices, sync_execution_with)

    def end_window(self, key: str, sync_execution: bool = True) -> EnergyCostMeasurement:
        """Close window `key` and return its time, energy and cost.

        Raises:
            ValueError: no window named `key` is open.
            ZeusElectricityPriceHTTPError, ZeusElectricityPriceNotFoundError: the tariff could
                not be fetched or has no rate for an hour of the window (the window stays open:
                call again).

        """
        periods = self.periods(key)  # the window must be open
        if self._tariff is None:
            self._tariff = self.electricity_price_provider.get_current_electricity_prices()
        tariff = self._tariff
        # Hours as the tariff reads them: the machine's local time. Checked before closing, so
        # a tariff without a rate for an hour of the window leaves the window open.
        for start in periods:
            rate_at(tariff, start.astimezone())
        m, slices = self._close(key, sync_execution)
        try:
            rates = [rate_at(tariff, start.astimezone()) for start, _ in slices]
        except ZeusElectricityPriceNotFoundError as e:  # an hour that began meanwhile
            e.measurement = m
            raise

        return EnergyCostMeasurement(**charged_fields(m, slices, rates, "energy_cost"))
