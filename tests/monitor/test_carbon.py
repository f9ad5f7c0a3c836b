"""`zeus.monitor.carbon`: the ElectricityMaps client against a local HTTP server that answers
as the API does, and `CarbonEmissionMonitor` on the simulated GPU and CPU with a provider whose
periods last a fraction of a second."""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from datetime import datetime, timedelta, timezone
from typing import Callable

import pytest
from childproc import run_python
from local_api import LocalApi
from zeus.monitor.carbon import (
    CarbonEmissionMonitor,
    CarbonIntensityProvider,
    ElectricityMapsClient,
    ElectrictyMapsClient,
    ZeusCarbonIntensityHTTPError,
    ZeusCarbonIntensityNotFoundError,
    get_ip_lat_long,
)

LATEST = {"zone": "US-MIDW-MISO", "carbonIntensity": 412, "datetime": "2026-11-23T21:00:00.000Z"}
HISTORY = {
    "zone": "US-MIDW-MISO",
    "history": [
        {"datetime": "2026-11-23T19:00:00.000Z", "carbonIntensity": 398},
        {"datetime": "2026-11-23T20:00:00.000Z", "carbonIntensity": None},
        {"datetime": "2026-11-23T21:00:00.000Z", "carbonIntensity": 412.5},
    ],
}


def test_client_reads_latest_and_history_with_its_parameters(
    api: LocalApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ELECTRICITYMAPS_API_KEY", raising=False)
    api.routes = {
        "/v3/carbon-intensity/latest": (200, LATEST),
        "/v3/carbon-intensity/history": (200, HISTORY),
    }
    client = ElectricityMapsClient(
        (42.28, -83.74), estimate=True, api_key="token-1", base_url=f"{api.url}/v3"
    )
    assert client.get_current_carbon_intensity() == 412.0
    recent = client.get_recent_carbon_intensity()
    hour = datetime(2026, 11, 23, 19, tzinfo=timezone.utc)
    assert recent == {hour: 398.0, hour + timedelta(hours=2): 412.5}  # the null hour left out
    for path, query, headers in api.requests:
        assert query == {
            "lat": ["42.28"],
            "lon": ["-83.74"],
            "disableEstimations": ["false"],
            "emissionFactorType": ["direct"],
        }, path
        assert headers.get("auth-token") == "token-1"
    assert client.update_period == timedelta(hours=1) and client.history_length == 24
    assert ElectrictyMapsClient is ElectricityMapsClient  # the reference's spelling

    # The key from the environment; none at all sends no header.
    monkeypatch.setenv("ELECTRICITYMAPS_API_KEY", "token-2")
    ElectricityMapsClient((0, 0), base_url=f"{api.url}/v3").get_current_carbon_intensity()
    assert api.requests[-1][2].get("auth-token") == "token-2"
    assert api.requests[-1][1]["disableEstimations"] == ["true"]
    monkeypatch.delenv("ELECTRICITYMAPS_API_KEY")
    ElectricityMapsClient((0, 0), base_url=f"{api.url}/v3").get_current_carbon_intensity()
    assert "auth-token" not in api.requests[-1][2]


def test_client_errors_say_what_went_wrong(api: LocalApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ELECTRICITYMAPS_API_KEY", raising=False)
    client = ElectricityMapsClient((10, 20), base_url=f"{api.url}/v3")
    api.routes = {"/v3/carbon-intensity/latest": (401, {"error": "missing token"})}
    with pytest.raises(ZeusCarbonIntensityHTTPError, match="HTTP 401.*ELECTRICITYMAPS_API_KEY"):
        client.get_current_carbon_intensity()
    api.routes = {
        "/v3/carbon-intensity/latest": (200, {"zone": "X"}),
        "/v3/carbon-intensity/history": (200, {"zone": "X"}),
    }
    with pytest.raises(ZeusCarbonIntensityNotFoundError, match=r"\(10.0, 20.0\)"):
        client.get_current_carbon_intensity()
    with pytest.raises(ZeusCarbonIntensityNotFoundError, match="no carbon-intensity history"):
        client.get_recent_carbon_intensity()
    api.close()
    with pytest.raises(ZeusCarbonIntensityHTTPError, match="Cannot reach ElectricityMaps"):
        client.get_current_carbon_intensity()
    with pytest.raises(ValueError, match=r"location=\(91, 0\)"):
        ElectricityMapsClient((91, 0))
    with pytest.raises(ValueError, match="emission_factor_type='indirect'"):
        ElectricityMapsClient((0, 0), emission_factor_type="indirect")  # type: ignore[arg-type]


def test_location_of_this_machine(api: LocalApi) -> None:
    api.routes = {"/json": (200, {"ip": "192.0.2.1", "loc": "42.2776,-83.7409"})}
    assert get_ip_lat_long(f"{api.url}/json") == (42.2776, -83.7409)
    api.routes = {"/json": (200, {"ip": "192.0.2.1"})}
    with pytest.raises(ZeusCarbonIntensityHTTPError, match="pass the location"):
        get_ip_lat_long(f"{api.url}/json")


class Steps(CarbonIntensityProvider):
    """Periods of `period_s` seconds whose intensity cycles through 100, 200, 300, 400."""

    def __init__(self, period_s: float, history: bool = True) -> None:
        self.period = timedelta(seconds=period_s)
        self.history = history
        self.down = False

    def value(self, start: datetime) -> float:
        k = round(start.timestamp() / self.period.total_seconds())
        return 100.0 * (1 + k % 4)

    def start_of(self, t: datetime) -> datetime:
        epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
        return epoch + ((t - epoch) // self.period) * self.period

    def get_current_carbon_intensity(self) -> float:
        if self.down:
            raise ZeusCarbonIntensityHTTPError("the provider is down")
        return self.value(self.start_of(datetime.now(timezone.utc)))

    def get_recent_carbon_intensity(self) -> dict[datetime, float]:
        if self.down:
            raise ZeusCarbonIntensityHTTPError("the provider is down")
        if not self.history:
            return {}
        now = self.start_of(datetime.now(timezone.utc))
        return {now - k * self.period: self.value(now - k * self.period) for k in range(24)}

    @property
    def update_period(self) -> timedelta:
        return self.period

    @property
    def history_length(self) -> int:
        return 24


def _mean_intensity(provider: Steps, t0: float, t1: float) -> float:
    """The time-weighted intensity over [t0, t1] (UNIX seconds)."""
    p = provider.period.total_seconds()
    total, t = 0.0, t0
    while t < t1:
        start = provider.start_of(datetime.fromtimestamp(t, timezone.utc))
        end = min(t1, start.timestamp() + p)
        total += (end - t) * provider.value(start)
        t = end
    return total / (t1 - t0)


def _slicer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "zeus-slicer"]


def _wait_no_slicer() -> None:
    deadline = time.monotonic() + 5
    while _slicer_threads():
        assert time.monotonic() < deadline, "the slicer thread outlived the last window"
        time.sleep(0.01)


def test_a_window_across_periods_is_charged_each_periods_intensity(
    sim_gpus: Callable[..., object],
) -> None:
    sim_gpus("A40,V100", clock="real", load="busy")
    provider = Steps(0.4)
    monitor = CarbonEmissionMonitor(provider, gpu_indices=[0, 1])
    t0 = time.time()
    monitor.begin_window("train")
    time.sleep(0.3)
    monitor.begin_window("inner")  # nested and overlapping windows each get their own slices
    time.sleep(1.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no short-window warning about the slices
        inner = monitor.end_window("inner")
        t_inner = time.time()
        outer = monitor.end_window("train")
    t1 = time.time()
    _wait_no_slicer()

    for m, start, end in ((outer, t0, t1), (inner, t0 + 0.3, t_inner)):
        want = _mean_intensity(provider, start, end)
        assert m.time == pytest.approx(end - start, abs=0.05)
        assert set(m.gpu_energy) == {0, 1} == set(m.gpu_carbon_emission)
        for i, e in m.gpu_energy.items():
            assert e > 0
            charged = m.gpu_carbon_emission[i] / e * 3.6e6  # gCO2eq/kWh
            assert charged == pytest.approx(want, rel=0.04), (i, charged, want)
        assert m.cpu_energy is None and m.cpu_carbon_emission is None
    # Several periods, with different intensities: the weighting is not a constant.
    assert _mean_intensity(provider, t0, t1) not in (100.0, 200.0, 300.0, 400.0)


CPU_CHILD = """
import json
from datetime import timedelta
import time
from zeus.monitor.carbon import CarbonEmissionMonitor, CarbonIntensityProvider

class Flat(CarbonIntensityProvider):
    def get_current_carbon_intensity(self):
        return 250.0
    def get_recent_carbon_intensity(self):
        return {}
    update_period = timedelta(hours=1)
    history_length = 24

monitor = CarbonEmissionMonitor(Flat(), gpu_indices=[], cpu_indices=[0, 1])
monitor.begin_window("w")
time.sleep(0.5)
m = monitor.end_window("w")
print(json.dumps({k: getattr(m, k) for k in (
    "gpu_energy", "cpu_energy", "cpu_carbon_emission", "dram_energy", "dram_carbon_emission")}))
"""


def test_cpu_and_dram_are_charged_too() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEUS_")}
    env.update(ZEUS_SIM_CPUS="2", PYTHONPATH=os.pathsep.join(sys.path))
    r = run_python(CPU_CHILD, env)
    assert r["gpu_energy"] == {}
    for part in ("cpu", "dram"):
        energy, emission = r[f"{part}_energy"], r[f"{part}_carbon_emission"]
        assert set(energy) == {"0", "1"} == set(emission)
        for k, e in energy.items():
            assert e > 0
            assert emission[k] == pytest.approx(e / 3.6e6 * 250.0)


@pytest.mark.filterwarnings("ignore:Measurement window 'w' lasted")  # a window closed at once
def test_an_unreachable_provider_leaves_the_window_open(sim_gpus: Callable[..., object]) -> None:
    sim_gpus("A40", clock="real", load="busy")
    provider = Steps(30.0)
    monitor = CarbonEmissionMonitor(provider)
    monitor.begin_window("w")
    provider.down = True
    with pytest.raises(ZeusCarbonIntensityHTTPError, match="down"):
        monitor.end_window("w")
    provider.down = False
    m = monitor.end_window("w")  # still open: measured now
    assert m.gpu_carbon_emission[0] > 0
    with pytest.raises(ValueError, match="'w' does not exist"):
        monitor.end_window("w")
    _wait_no_slicer()


def test_a_period_without_intensity_keeps_the_energy(sim_gpus: Callable[..., object]) -> None:
    sim_gpus("A40", clock="real", load="busy")
    provider = Steps(0.25, history=False)  # past periods cannot be looked up
    monitor = CarbonEmissionMonitor(provider)
    monitor.begin_window("w")
    with pytest.raises(ValueError, match="'w' already exists"):
        monitor.begin_window("w")
    time.sleep(0.6)
    with pytest.raises(ZeusCarbonIntensityNotFoundError, match="of window 'w'") as err:
        monitor.end_window("w")
    assert err.value.measurement is not None
    assert err.value.measurement.gpu_energy[0] > 0  # the energy is not lost
    with pytest.raises(ValueError, match="does not exist"):
        monitor.end_window("w")  # closed
    _wait_no_slicer()
