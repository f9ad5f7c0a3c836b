"""zeus.metric against a real Pushgateway (and Prometheus), on the simulated GPU.

The simulated GPUs run busy on the real clock at ideal fidelity, so they draw a constant,
known power and a window's energy is that power times its length.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
from typing import Any

import pytest
import zeus.device.sim
import zeus.metric
from childproc import run_python
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_servers import PrometheusFactory, Pushgateway, free_port, sample_value
from zeus.metric import EnergyCumulativeCounter, EnergyHistogram, PowerGauge
from zeus.monitor import ZeusMonitor

pytest.importorskip("prometheus_client")

GPUS = [0, 1]
HIST = "energy_monitor_gpu_energy_joules"
COUNTER = "energy_monitor_gpu_energy_joules_total"
GAUGE = "power_monitor_gpu_power_watts"


@pytest.fixture
def busy(sim_gpus: Any) -> dict[int, float]:
    """Two busy simulated GPUs on the real clock; returns their power in watts."""
    sim_gpus("A40,V100", clock="real", load="busy")
    return {i: zeus.device.sim.true_power(i) for i in GPUS}


def unreachable_url() -> str:
    return f"127.0.0.1:{free_port()}"


# ---- EnergyHistogram -------------------------------------------------------------------------


def test_histogram_pushes_every_window_energy(
    busy: dict[int, float], pushgateway: Pushgateway
) -> None:
    buckets = [20.0, 40.0, 60.0, 1000.0]
    hist = EnergyHistogram(
        cpu_indices=[],
        gpu_indices=GPUS,
        pushgateway_url=pushgateway.address,
        job="hist",
        gpu_bucket_range=buckets,
    )
    measured: dict[str, list[Any]] = {"step": [], "eval": []}
    for seconds, name in [(0.12, "step"), (0.25, "step"), (0.15, "eval"), (0.2, "step")]:
        hist.begin_window(name)
        time.sleep(seconds)
        measured[name].append(hist.end_window(name))

    for name, measurements in measured.items():
        for i in GPUS:
            energies = [m.energy[i] for m in measurements]
            # The simulated GPU draws constant power: energy = power * time.
            for m in measurements:
                assert m.energy[i] == pytest.approx(busy[i] * m.time, rel=0.02)
            labels = {"job": "hist", "window": name, "index": str(i)}
            assert pushgateway.value(f"{HIST}_count", **labels) == len(energies)
            assert pushgateway.value(f"{HIST}_sum", **labels) == pytest.approx(sum(energies))
            for le in buckets:
                count = pushgateway.value(f"{HIST}_bucket", le=f"{le:g}", **labels)
                assert count == sum(e <= le for e in energies), (name, i, le)
            assert pushgateway.value(f"{HIST}_bucket", le="+Inf", **labels) == len(energies)


def test_histogram_warns_above_its_largest_bucket(
    busy: dict[int, float], pushgateway: Pushgateway
) -> None:
    hist = EnergyHistogram([], [0], pushgateway.address, "hist", gpu_bucket_range=[0.5, 1.0])
    hist.begin_window("long")
    time.sleep(0.12)
    with pytest.warns(UserWarning, match=r"exceeds the largest gpu bucket \(1.0 J\)"):
        hist.end_window("long")
    assert pushgateway.value(f"{HIST}_bucket", le="+Inf", window="long", index="0") == 1


def test_histogram_window_names_are_checked(busy: dict[int, float]) -> None:
    hist = EnergyHistogram([], [0], unreachable_url(), "hist")
    with pytest.raises(ValueError, match="'w' is not open"):
        hist.end_window("w")
    hist.begin_window("w")
    with pytest.raises(ValueError, match="'w' is already open"):
        hist.begin_window("w")


def test_histogram_push_failure_raises(busy: dict[int, float]) -> None:
    hist = EnergyHistogram([], [0], unreachable_url(), "hist")
    hist.begin_window("w")
    time.sleep(0.12)
    with pytest.raises((urllib.error.URLError, OSError)):
        hist.end_window("w")
    # The window is closed all the same.
    hist.begin_window("w")


# ---- EnergyCumulativeCounter -----------------------------------------------------------------


def test_counter_pushes_while_open_and_totals_the_window(
    busy: dict[int, float], pushgateway: Pushgateway
) -> None:
    counter = EnergyCumulativeCounter(
        cpu_indices=[],
        gpu_indices=GPUS,
        update_period=0.2,
        pushgateway_url=pushgateway.address,
        job="counter",
    )
    reference = ZeusMonitor(gpu_indices=GPUS)
    reference.begin_window("reference")
    before_begin = time.time()
    counter.begin_window("train")
    after_begin = time.time()
    assert counter.open_windows == ["train"]

    # Pushed periodically while the window is open, and growing.
    first = pushgateway.wait_for_samples(COUNTER, job="counter", window="train", index="0")
    time.sleep(0.5)
    second = pushgateway.value(COUNTER, job="counter", window="train", index="0")
    assert 0 < first[0][1] < second

    time.sleep(0.3)
    before_end = time.time()
    counter.end_window("train")
    after_end = time.time()
    measured = reference.end_window("reference")
    assert counter.open_windows == []

    for i in GPUS:
        total = pushgateway.value(COUNTER, job="counter", window="train", index=str(i))
        # The reference window spans the counter's window and the calls' own time.
        assert total == pytest.approx(measured.energy[i], rel=0.02)
        # Constant power: the total is the energy from some time during begin_window to some
        # time during end_window.
        assert busy[i] * (before_end - after_begin) * 0.999 <= total
        assert total <= busy[i] * (after_end - before_begin) * 1.001

    # No pushes after the window ended.
    time.sleep(0.5)
    assert pushgateway.value(COUNTER, job="counter", window="train", index="1") == total


def test_counter_windows_run_side_by_side_and_reopen_continues(
    busy: dict[int, float], pushgateway: Pushgateway
) -> None:
    counter = EnergyCumulativeCounter([], [0], 0.1, pushgateway.url, "counter")
    counter.begin_window("a")
    counter.begin_window("b")
    with pytest.raises(ValueError, match="'a' is already open"):
        counter.begin_window("a")
    time.sleep(0.3)
    counter.end_window("a")
    time.sleep(0.2)
    counter.end_window("b")
    with pytest.raises(ValueError, match="'b' is not open"):
        counter.end_window("b")

    # One registry per object: both windows' series stay in the job's group.
    a = pushgateway.value(COUNTER, window="a", index="0")
    b = pushgateway.value(COUNTER, window="b", index="0")
    assert b > a > 0
    assert b - a == pytest.approx(busy[0] * 0.2, rel=0.25)

    counter.begin_window("a")
    time.sleep(0.2)
    counter.end_window("a")
    assert pushgateway.value(COUNTER, window="a", index="0") == pytest.approx(
        a + busy[0] * 0.2, rel=0.1
    )


def test_counter_logs_push_failures_and_keeps_counting(
    busy: dict[int, float], caplog: pytest.LogCaptureFixture
) -> None:
    counter = EnergyCumulativeCounter([], [0], 0.05, unreachable_url(), "counter")
    with caplog.at_level(logging.WARNING, logger="zeus.metric"):
        counter.begin_window("w")
        time.sleep(0.3)
        counter.end_window("w")
    failures = [r for r in caplog.records if "push to the Pushgateway" in r.getMessage()]
    assert len(failures) == 1  # once, not once per period
    value = counter.registry.get_sample_value(COUNTER, {"window": "w", "index": "0"})
    assert value == pytest.approx(busy[0] * 0.3, rel=0.1)


def test_open_windows_are_closed_and_pushed_at_exit(pushgateway: Pushgateway) -> None:
    script = textwrap.dedent(
        f"""
        import time
        from zeus.metric import EnergyCumulativeCounter, PowerGauge
        counter = EnergyCumulativeCounter([], [0], 60, {pushgateway.address!r}, "at-exit")
        counter.begin_window("never-ended")
        gauge = PowerGauge([0], 60, {pushgateway.address!r}, "at-exit-gauge")
        gauge.begin_window("never-ended")
        time.sleep(0.3)
        """
    )
    env = {
        **os.environ,
        "ZEUS_GPU_BACKEND": "sim",
        "ZEUS_SIM_GPUS": "A40",
        "ZEUS_SIM_CLOCK": "real",
        "ZEUS_SIM_LOAD": "busy",
        "ZEUS_SIM_FIDELITY": "ideal",
    }
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    # The 60 s update period did not hold the exit up.
    assert time.monotonic() - started < 30
    total = pushgateway.value(COUNTER, job="at-exit", window="never-ended", index="0")
    assert total == pytest.approx(202.5 * 0.3, rel=0.3)
    # The gauge's window ended too: its series was removed.
    assert pushgateway.samples(GAUGE, job="at-exit-gauge") == []


# ---- PowerGauge ------------------------------------------------------------------------------


def test_gauge_pushes_power_while_open_and_removes_it_after(
    busy: dict[int, float], pushgateway: Pushgateway
) -> None:
    gauge = PowerGauge(
        gpu_indices=GPUS, update_period=0.1, pushgateway_url=pushgateway.address, job="gauge"
    )
    gauge.begin_window("train")
    for i in GPUS:
        found = pushgateway.wait_for_samples(GAUGE, job="gauge", window="train", index=str(i))
        assert found[0][1] == pytest.approx(busy[i], rel=0.01)

    # Power follows the GPU: idle power after the load stops.
    zeus.device.sim.set_busy(0, False)
    idle = zeus.device.sim.true_power(0)
    assert idle < busy[0] / 2
    deadline = time.monotonic() + 5
    while pushgateway.value(GAUGE, window="train", index="0") != pytest.approx(idle, rel=0.01):
        assert time.monotonic() < deadline, "the gauge never showed the idle power"
        time.sleep(0.05)

    gauge.end_window("train")
    assert pushgateway.samples(GAUGE, job="gauge") == []


def test_prometheus_scrapes_what_the_metrics_push(
    busy: dict[int, float], pushgateway: Pushgateway, prometheus_factory: PrometheusFactory
) -> None:
    prom = prometheus_factory(scrape={"pushgateway": [pushgateway.address]})
    gauge = PowerGauge(GPUS, 0.2, pushgateway.address, "zeus-power")
    counter = EnergyCumulativeCounter([], GPUS, 0.2, pushgateway.address, "zeus-energy")
    gauge.begin_window("train")
    counter.begin_window("train")
    try:
        power = prom.wait_for(f'{GAUGE}{{job="zeus-power", window="train"}}')
        assert {r["metric"]["index"]: sample_value(r) for r in power} == {
            str(i): pytest.approx(busy[i], rel=0.01) for i in GPUS
        }
        # The counter as scraped over five seconds or more: its slope is the GPU's power. Each
        # scrape takes the value of the latest push, up to a push period (0.2 s) old and more
        # on a busy machine; over the last two scrapes alone (`irate`, 1 s apart) that put the
        # slope 21% off (161 W for 202.5 W) beside the CI run; over five, a few percent.
        scraped = prom.wait_for(
            f'{COUNTER}{{job="zeus-energy", window="train", index="0"}}[30s]',
            until=lambda r: bool(r) and len(r[0]["values"]) >= 6,
        )
        (t0, v0), (t1, v1) = scraped[0]["values"][0], scraped[0]["values"][-1]
        slope = (float(v1) - float(v0)) / (float(t1) - float(t0))
        assert slope == pytest.approx(busy[0], rel=0.2)
    finally:
        gauge.end_window("train")
        counter.end_window("train")


# ---- CPU and DRAM ----------------------------------------------------------------------------


def test_cpu_and_dram_energy_are_pushed(pushgateway: Pushgateway) -> None:
    """Simulated GPU and two simulated CPU packages (configured once per process: a child)."""
    code = f"""
        import json, time
        import zeus.device.sim as sim
        from zeus.metric import EnergyCumulativeCounter, EnergyHistogram
        hist = EnergyHistogram([0, 1], [0], {pushgateway.address!r}, "cpu-hist")
        counter = EnergyCumulativeCounter([1], [], 0.5, {pushgateway.address!r}, "cpu-counter")
        # No framework sync: looking for one imports PyTorch, seconds inside the window.
        counter.begin_window("w", sync_execution=False)
        # Each window edge is bracketed: what the simulated counters' writer thread had
        # published before it (it may lag on a loaded machine), the truth after it.
        lo0 = [sim.cpu_published_energy(k) for k in (0, 1)]
        hist.begin_window("w", sync_execution=False)
        hi0 = [sim.cpu_true_energy(k) for k in (0, 1)]
        time.sleep(2.0)
        lo1 = [sim.cpu_published_energy(k) for k in (0, 1)]
        m = hist.end_window("w", sync_execution=False)
        hi1 = [sim.cpu_true_energy(k) for k in (0, 1)]
        counter.end_window("w", sync_execution=False)
        diff = lambda a, b: [[y - x for x, y in zip(p, q)] for p, q in zip(a, b)]
        print(json.dumps({{
            "gpu": m.gpu_energy, "cpu": m.cpu_energy, "dram": m.dram_energy,
            "lo": diff(hi0, lo1), "hi": diff(lo0, hi1),
        }}))
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEUS_")}
    env.update(
        ZEUS_GPU_BACKEND="sim",
        ZEUS_SIM_GPUS="A40",
        ZEUS_SIM_LOAD="busy",
        ZEUS_SIM_CPUS="2",
        # 80 J (DRAM 10 J): the counters wrap inside the window.
        ZEUS_SIM_RAPL_MAX_UJ="80000000",
    )
    r = run_python(code, env)
    lo, hi = r["lo"], r["hi"]
    for k in ("0", "1"):
        # The histogram's window against the simulator's bracketed truth.
        for kind, z in (("cpu", 0), ("dram", 1)):
            bounds = (lo[int(k)][z], hi[int(k)][z])
            assert bounds[0] * 0.99 <= r[kind][k] <= bounds[1] * 1.01, (kind, k, r)
    for kind in ("gpu", "cpu", "dram"):
        for k, joules in r[kind].items():
            name = f"energy_monitor_{kind}_energy_joules_sum"
            pushed = pushgateway.value(name, job="cpu-hist", window="w", index=k)
            assert pushed == pytest.approx(joules, rel=1e-9)
    # The counter measured package 1 and its DRAM only, over a little more than those 2 s.
    cpu = pushgateway.value("energy_monitor_cpu_energy_joules_total", job="cpu-counter", index="1")
    dram = pushgateway.value(
        "energy_monitor_dram_energy_joules_total", job="cpu-counter", index="1"
    )
    assert lo[1][0] * 0.99 <= cpu <= hi[1][0] * 1.05
    assert lo[1][1] * 0.99 <= dram <= hi[1][1] * 1.05
    assert pushgateway.samples("energy_monitor_cpu_energy_joules_total", index="0") == []
    assert pushgateway.samples(COUNTER, job="cpu-counter") == []


# ---- arguments -------------------------------------------------------------------------------


def test_missing_prometheus_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"zeus-energy\[prometheus\]"):
        PowerGauge([0], 1, "localhost:9091", "job")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: EnergyHistogram([], [0], "localhost:9091", ""), "job must be a non-empty"),
        (lambda: EnergyHistogram([], [0], "localhost:9091", "  "), "job must be a non-empty"),
        (lambda: PowerGauge([0], 1, "localhost:9091", None), "got None"),
        (lambda: EnergyHistogram([], [0], "", "j"), "got ''"),
        (lambda: EnergyHistogram([], [0], "ftp://host:21", "j"), "http or https.*ftp://host:21"),
        (lambda: PowerGauge([0], 1, "localhost:99999", "j"), "invalid port.*localhost:99999"),
        (lambda: PowerGauge([0], 1, "http://:9091", "j"), "no host.*'http://:9091'"),
        (lambda: PowerGauge([0], 1, "local host:9091", "j"), "'local host:9091'"),
        (lambda: PowerGauge([0], 1, "http://h:1/?a=b", "j"), "query or fragment"),
        (lambda: PowerGauge([0], -1, "localhost:9091", "j"), "update_period.*got -1"),
        (lambda: PowerGauge([0], 0, "localhost:9091", "j"), "update_period.*got 0"),
        (lambda: PowerGauge([0], math.nan, "h:1", "j"), "update_period.*got nan"),
        (lambda: PowerGauge([0], "1", "h:1", "j"), "update_period.*got '1'"),
        (lambda: PowerGauge([0], True, "h:1", "j"), "update_period.*got True"),
        (lambda: EnergyCumulativeCounter([], [0], -0.5, "h:1", "j"), "got -0.5"),
        (lambda: PowerGauge([], 1, "h:1", "j"), "gpu_indices is empty"),
        (lambda: PowerGauge([-1], 1, "h:1", "j"), r"gpu_indices=\[-1\]: -1 is not a device index"),
        (
            lambda: PowerGauge([0, 0], 1, "h:1", "j"),
            r"gpu_indices=\[0, 0\]: device 0 appears twice",
        ),
        (
            lambda: PowerGauge("0", 1, "h:1", "j"),
            "gpu_indices='0': expected a list of device indices",
        ),
        (lambda: EnergyCumulativeCounter([], [], 1, "h:1", "j"), "nothing to measure"),
        (lambda: EnergyHistogram([], [0], "h:1", "j", gpu_bucket_range=[]), "must not be empty"),
        (
            lambda: EnergyHistogram([], [0], "h:1", "j", cpu_bucket_range=[5, 1]),
            r"cpu_bucket_range must be strictly increasing, got \[5, 1\]",
        ),
        (
            lambda: EnergyHistogram([], [0], "h:1", "j", dram_bucket_range=[1, "x"]),
            "dram_bucket_range must hold numbers >= 0, got 'x'",
        ),
        (
            lambda: EnergyHistogram([], [0], "h:1", "j", gpu_bucket_range=[math.inf, 1]),
            "strictly increasing",
        ),
    ],
)
def test_bad_arguments_are_named(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_good_urls_are_accepted() -> None:
    for url in ["localhost:9091", "http://127.0.0.1:9091", "https://gw.example/prefix", "gw"]:
        assert zeus.metric._check_url(url) == url


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(finite, st.just(math.inf), st.just(math.nan), st.integers(-5, 10**6)),
        max_size=8,
    )
)
def test_bucket_rule(buckets: list[float]) -> None:
    """Accepted iff non-empty, all >= 0, strictly increasing, the first finite.

    (So an infinite bound can only come last, and a finite one comes before it.)
    """
    valid = (
        len(buckets) > 0
        and all(not math.isnan(b) and b >= 0 for b in buckets)
        and all(lo < hi for lo, hi in zip(buckets, buckets[1:]))
        and math.isfinite(buckets[0])
    )
    if not valid:
        with pytest.raises(ValueError, match="gpu_bucket_range"):
            zeus.metric._check_buckets("gpu_bucket_range", buckets)
        return
    checked = zeus.metric._check_buckets("gpu_bucket_range", buckets)
    assert checked == [float(b) for b in buckets]
    # Whatever passes is a histogram prometheus_client builds.
    import prometheus_client

    prometheus_client.Histogram(
        "h", "h", buckets=checked, registry=prometheus_client.CollectorRegistry()
    )


@given(st.one_of(finite, st.integers(-(10**6), 10**6), st.just(math.inf), st.just(-math.inf)))
def test_update_period_rule(period: float) -> None:
    """Any finite number of seconds > 0 is a period; nothing else is."""
    if math.isfinite(period) and period > 0:
        assert zeus.metric._check_period(period) == float(period)
    else:
        with pytest.raises(ValueError, match="update_period"):
            zeus.metric._check_period(period)


@given(
    st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,10}){0,3}", fullmatch=True),
    st.integers(1, 65535),
    st.sampled_from(["", "http://", "https://"]),
)
def test_host_port_urls_are_accepted(host: str, port: int, scheme: str) -> None:
    url = f"{scheme}{host}:{port}"
    assert zeus.metric._check_url(url) == url


@given(st.text(min_size=1).filter(lambda s: s.strip() != ""))
def test_any_non_blank_job_is_accepted(job: str) -> None:
    assert zeus.metric._check_job(job) == job


def test_pushgateway_json_api_agrees(busy: dict[int, float], pushgateway: Pushgateway) -> None:
    """The Pushgateway's own JSON view lists the group under the job it was pushed to."""
    hist = EnergyHistogram([], [0], pushgateway.address, "json-job")
    hist.begin_window("w")
    time.sleep(0.12)
    hist.end_window("w")
    import urllib.request

    with urllib.request.urlopen(f"{pushgateway.url}/api/v1/metrics", timeout=5) as resp:
        groups = json.load(resp)["data"]
    assert [g["labels"]["job"] for g in groups] == ["json-job"]
    assert HIST in groups[0]


class BrokenPowerMonitor:
    def __init__(self, gpu_indices: Any = None) -> None:
        self.stopped = False

    def sample_now(self) -> bool:
        return True

    def get_power(self) -> dict[int, float]:
        raise RuntimeError("the GPU fell off the bus")

    def stop(self) -> None:
        self.stopped = True


def test_a_failing_reading_is_logged_and_the_window_still_ends(
    monkeypatch: pytest.MonkeyPatch, pushgateway: Pushgateway, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(zeus.metric, "PowerMonitor", BrokenPowerMonitor)
    gauge = PowerGauge([0], 0.05, pushgateway.address, "broken")
    with caplog.at_level(logging.ERROR, logger="zeus.metric"):
        gauge.begin_window("w")
        time.sleep(0.2)
        gauge.end_window("w")
    assert any("update failed" in r.getMessage() for r in caplog.records)
    assert gauge.open_windows == []
    assert pushgateway.samples(GAUGE, job="broken") == []
