"""A real Prometheus scrapes `zeus-monitor serve` on simulated GPUs and CPUs.

Prometheus (Debian's 2.42, `.ci/prometheus.sh`) scrapes the exporter every second for 30 s;
the energy rates it computes are compared with the simulators' truth: the busy GPU's constant
power, and the simulated CPU model's energy between the scrapes' own timestamps (the model runs
on wall-clock time, so this process can compute what the exporter's process simulated).
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest
import zeus.device.sim
from prometheus_servers import PrometheusFactory, sample_value

WINDOW_S = 30


def raw_samples(prom: Any, selector: str, at: float) -> dict[tuple[str, ...], list[list[Any]]]:
    """`selector[30s]` at `at`: label values -> [[timestamp, "value"], ...]."""
    out = {}
    for series in prom.query(f"{selector}[{WINDOW_S}s]", at=at):
        labels = series["metric"]
        key = tuple(labels.get(k, "") for k in ("gpu", "cpu", "domain"))
        out[key] = series["values"]
    return out


def test_prometheus_rates_match_the_simulated_truth(
    exporter: str, prometheus_factory: PrometheusFactory, sim_gpus: Any
) -> None:
    # The same simulated H100 in this process, busy at its default limit: its true power.
    sim_gpus("H100", clock="real", load="busy")
    gpu_watts = zeus.device.sim.true_power(0)

    prom = prometheus_factory(scrape={"zeus": [exporter]}, scrape_interval="1s")
    prom.wait_for('zeus_gpu_energy_joules_total{job="zeus"}')
    prom.wait_for('zeus_cpu_energy_joules_total{job="zeus"}')
    time.sleep(WINDOW_S + 2)
    at = time.time()

    # Every scrape of the window made it (1 s apart), and Prometheus saw the target healthy.
    gpu = raw_samples(prom, "zeus_gpu_energy_joules_total", at)
    assert len(gpu[("0", "", "")]) >= WINDOW_S - 2, gpu
    assert all(t["health"] == "up" for t in prom.targets())

    rate = {
        (s["metric"].get("gpu", ""), s["metric"].get("cpu", ""), s["metric"].get("domain", "")): (
            sample_value(s)
        )
        for expr in ("zeus_gpu_energy_joules_total", "zeus_cpu_energy_joules_total")
        for s in prom.query(f"rate({expr}[{WINDOW_S}s])", at=at)
    }
    assert rate[("0", "", "")] == pytest.approx(gpu_watts, rel=0.02), (rate, gpu_watts)

    # The CPU package and DRAM: the model's energy between the first and last scrape of the
    # window, over the time between them, which is what rate() extrapolates to the window.
    cpu = raw_samples(prom, "zeus_cpu_energy_joules_total", at)
    for domain, k in (("package", 0), ("dram", 1)):
        values = cpu[("", "0", domain)]
        (t0, _), (t1, _) = values[0], values[-1]
        true_w = (
            zeus.device.sim.cpu_model_energy(0, t1)[k] - zeus.device.sim.cpu_model_energy(0, t0)[k]
        ) / (t1 - t0)
        assert rate[("", "0", domain)] == pytest.approx(true_w, rel=0.02), (domain, rate, true_w)


def test_a_scrape_passes_promtool(exporter: str) -> None:
    import shutil
    import urllib.request

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package `prometheus`; .ci/prometheus.sh)")
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(f"http://{exporter}/metrics", timeout=10) as r:
            body = r.read()
        if b"zeus_gpu_energy_joules_total{" in body and b"zeus_cpu_energy_joules_total{" in body:
            break
        assert time.monotonic() < deadline, body.decode()
        time.sleep(0.1)
    out = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
    assert out.returncode == 0, (out.stdout + out.stderr).decode()
