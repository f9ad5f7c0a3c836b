"""`zeus.monitor.price`: the OpenEI client against a local server that answers as the API does,
tariff lookup by local time, and `EnergyCostMonitor` on the simulated GPU."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any, Callable

import pytest
from local_api import LocalApi
from zeus.monitor.price import (
    ElectricityPriceProvider,
    EnergyCostMonitor,
    OpenEIClient,
    ZeusElectricityPriceHTTPError,
    ZeusElectricityPriceNotFoundError,
    rate_at,
)

# A time-of-use tariff: period h holds hour h on weekdays (rate 0.01 * (h + 1), adj 0.001),
# and one flat period (24) on weekends, every month.
STRUCTURE = [[{"rate": 0.01 * (h + 1), "adj": 0.001, "unit": "kWh"}] for h in range(24)]
STRUCTURE.append([{"rate": 0.5, "unit": "kWh"}])
TARIFF = {
    "energy_rate_structure": STRUCTURE,
    "energy_weekday_schedule": [list(range(24)) for _ in range(12)],
    "energy_weekend_schedule": [[24] * 24 for _ in range(12)],
}
ITEMS = {
    "items": [
        {"label": "other", "name": "Flat", "energyratestructure": [[{"rate": 0.2}]]},
        {
            "label": "5a1b",
            "name": "E-TOU",
            "energyratestructure": STRUCTURE,
            "energyweekdayschedule": TARIFF["energy_weekday_schedule"],
            "energyweekendschedule": TARIFF["energy_weekend_schedule"],
        },
    ]
}


def test_client_finds_the_labelled_tariff(api: LocalApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENEI_API_KEY", "secret-key")
    api.routes = {"/utility_rates": (200, ITEMS)}
    client = OpenEIClient((37.77, -122.42), "5a1b", "Commercial", radius=5, base_url=api.url)
    assert client.get_current_electricity_price() == TARIFF
    _, query, _ = api.requests[-1]
    assert query == {
        "version": ["7"],
        "format": ["json"],
        "detail": ["full"],
        "api_key": ["secret-key"],
        "lat": ["37.77"],
        "lon": ["-122.42"],
        "radius": ["5"],
        "sector": ["Commercial"],
    }
    assert "secret-key" not in repr(client)


def test_client_errors(api: LocalApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENEI_API_KEY", "")  # blank counts as unset: the demo key
    with pytest.warns(UserWarning, match="DEMO_KEY"):
        OpenEIClient((0, 0), "x", base_url=api.url)
    client = OpenEIClient((0, 0), "missing", api_key="k-123", base_url=api.url)
    api.routes = {"/utility_rates": (200, ITEMS)}
    with pytest.raises(ZeusElectricityPriceNotFoundError, match=r"'missing'.*\['other', '5a1b'\]"):
        client.get_current_electricity_price()
    with pytest.raises(ZeusElectricityPriceNotFoundError, match="'other' has no energyweekday"):
        OpenEIClient((0, 0), "other", api_key="k", base_url=api.url).get_current_electricity_price()
    api.routes = {"/utility_rates": (500, {"error": "bad key k-123"})}
    with pytest.raises(ZeusElectricityPriceHTTPError, match="HTTP 500") as err:
        client.get_current_electricity_price()
    assert "k-123" not in str(err.value)  # the key is never printed
    assert "DEMO_KEY" not in str(err.value)  # a key of one's own: no demo-key hint
    with pytest.raises(ValueError, match="sector='Farm'"):
        OpenEIClient((0, 0), "x", sector="Farm")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="radius=-1"):
        OpenEIClient((0, 0), "x", radius=-1)
    with pytest.raises(ValueError, match="api_key=' '"):
        OpenEIClient((0, 0), "x", api_key=" ")
    with pytest.raises(ValueError, match="api_key: expected a string, not int"):
        OpenEIClient((0, 0), "x", api_key=123)  # type: ignore[arg-type]


def test_zeus016_client_needs_no_key_of_the_users(
    api: LocalApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Zeus 0.16 code: `OpenEIClient(location, label)` with no key anywhere, then
    `get_current_electricity_prices()`; the public demo key is used, with one warning."""
    monkeypatch.delenv("OPENEI_API_KEY", raising=False)
    api.routes = {"/utility_rates": (200, ITEMS)}
    with pytest.warns(UserWarning) as warned:
        client = OpenEIClient((37.77, -122.42), "5a1b", base_url=api.url)
        assert client.get_current_electricity_prices() == TARIFF
        assert client.get_current_electricity_price() == TARIFF  # the earlier name
    # Only the client's own warnings: a socket another test left for the collector may warn
    # (ResourceWarning) while this block runs.
    messages = [str(w.message) for w in warned if issubclass(w.category, UserWarning)]
    assert len(messages) == 1, messages
    assert "DEMO_KEY" in messages[0] and "rate-limited" in messages[0]
    assert "OPENEI_API_KEY" in messages[0]
    assert [q["api_key"] for _, q, _ in api.requests] == [["DEMO_KEY"], ["DEMO_KEY"]]
    assert "DEMO_KEY" not in repr(client)
    # The demo key's limit: the error says how to get past it.
    api.routes = {"/utility_rates": (429, {"error": {"code": "OVER_RATE_LIMIT"}})}
    with pytest.raises(ZeusElectricityPriceHTTPError, match="HTTP 429") as err:
        client.get_current_electricity_prices()
    assert "rate-limited" in str(err.value) and "OPENEI_API_KEY" in str(err.value)


def test_a_key_of_ones_own_wins_and_is_never_shown(
    api: LocalApi, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OPENEI_API_KEY", "env-key")
    api.routes = {"/utility_rates": (200, ITEMS)}
    caplog.set_level("DEBUG", logger="zeus")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no demo-key warning
        OpenEIClient((0, 0), "5a1b", base_url=api.url).get_current_electricity_prices()
        arg = OpenEIClient((0, 0), "5a1b", api_key="arg-key", base_url=api.url)
        arg.get_current_electricity_prices()
    assert [q["api_key"] for _, q, _ in api.requests] == [["env-key"], ["arg-key"]]
    assert "arg-key" not in repr(arg)
    assert "env-key" not in caplog.text and "arg-key" not in caplog.text


def test_rate_at_reads_month_day_type_and_hour() -> None:
    monday_5pm = datetime(2026, 11, 23, 17, 30)
    assert rate_at(TARIFF, monday_5pm) == pytest.approx(0.18 + 0.001)
    assert rate_at(TARIFF, monday_5pm.replace(hour=0)) == pytest.approx(0.011)
    assert rate_at(TARIFF, datetime(2026, 11, 22, 17)) == 0.5  # a Sunday
    broken = {**TARIFF, "energy_weekday_schedule": [list(range(24))] * 11}  # no December
    with pytest.raises(ZeusElectricityPriceNotFoundError, match="December weekdays at 9:00"):
        rate_at(broken, datetime(2026, 12, 1, 9))


class Fixed(ElectricityPriceProvider):
    def __init__(self, tariff: dict[str, list[Any]]) -> None:
        self.tariff = tariff
        self.calls = 0
        self.down = False

    def get_current_electricity_price(self) -> dict[str, list[Any]]:
        self.calls += 1
        if self.down:
            raise ZeusElectricityPriceHTTPError("the provider is down")
        return self.tariff


class Zeus016Provider(ElectricityPriceProvider):
    """A provider written for Zeus 0.16: it implements `get_current_electricity_prices`."""

    def get_current_electricity_prices(self) -> dict[str, list[Any]]:
        return TARIFF


def test_both_method_names_answer_for_either_kind_of_provider() -> None:
    old, new = Fixed(TARIFF), Zeus016Provider()
    for provider in (old, new):
        assert provider.get_current_electricity_prices() == TARIFF
        assert provider.get_current_electricity_price() == TARIFF
    assert old.calls == 2  # both names went to the one implementation

    class Nothing(ElectricityPriceProvider):
        pass

    with pytest.raises(TypeError, match="get_current_electricity_prices"):
        Nothing()  # type: ignore[abstract]


def test_a_zeus016_provider_prices_windows(sim_gpus: Callable[..., object]) -> None:
    sim_gpus("A40", clock="real", load="busy")
    monitor = EnergyCostMonitor(Zeus016Provider(), gpu_indices=[0])
    monitor.begin_window("w", sync_execution=False)
    time.sleep(0.2)
    m = monitor.end_window("w", sync_execution=False)
    assert m.gpu_energy[0] > 0 and m.gpu_energy_cost[0] > 0


@pytest.fixture
def los_angeles(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process in California's time zone (tariff hours are local)."""
    monkeypatch.setenv("TZ", "America/Los_Angeles")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_a_window_costs_its_energy_at_the_local_hours_rate(
    sim_gpus: Callable[..., object], los_angeles: None
) -> None:
    sim_gpus("A40,V100", clock="real", load="busy")
    provider = Fixed(TARIFF)
    monitor = EnergyCostMonitor(provider, gpu_indices=[0, 1])
    for _ in range(2):
        monitor.begin_window("step", sync_execution=False)
        time.sleep(0.3)
        m = monitor.end_window("step", sync_execution=False)
        # Rates by the local hour: near an hour's end the window may straddle two.
        rates = {rate_at(TARIFF, datetime.now() - timedelta(seconds=s)) for s in (0, 0.4)}
        for i, e in m.gpu_energy.items():
            assert e > 0
            per_kwh = m.gpu_energy_cost[i] / (e / 3.6e6)
            assert min(rates) - 1e-9 <= per_kwh <= max(rates) + 1e-9, (per_kwh, rates)
        assert m.cpu_energy is None and m.cpu_energy_cost is None
    assert provider.calls == 1  # the tariff is fetched once


@pytest.mark.filterwarnings("ignore:Measurement window 'w' lasted")  # a window closed at once
def test_a_tariff_that_cannot_be_had_leaves_the_window_open(
    sim_gpus: Callable[..., object],
) -> None:
    sim_gpus("A40", clock="real", load="busy")
    provider = Fixed(TARIFF)
    provider.down = True
    monitor = EnergyCostMonitor(provider)
    monitor.begin_window("w", sync_execution=False)
    with pytest.raises(ZeusElectricityPriceHTTPError, match="down"):
        monitor.end_window("w")
    provider.tariff = {**TARIFF, "energy_weekday_schedule": [], "energy_weekend_schedule": []}
    provider.down = False
    with pytest.raises(ZeusElectricityPriceNotFoundError, match="no rate"):
        monitor.end_window("w")
    monitor._tariff = TARIFF  # the next fetch would bring a mended tariff
    assert monitor.end_window("w").gpu_energy_cost[0] > 0  # still open, measured now
    with pytest.raises(ValueError, match="does not exist"):
        monitor.end_window("w")
