"""`ServingMetrics`: an `EnergyLedger`'s records as Prometheus metrics.

The ledger runs on the simulated GPU (virtual clock, ideal readings) with the `tokens` method,
so each record's energy is known; the metrics are read back from their text exposition, checked
by `promtool check metrics`, and scraped by a real Prometheus (`tests/prometheus_servers.py`).
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import urllib.request
from typing import Any

import pytest
import zeus.device.sim
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_servers import PrometheusFactory, sample_value
from zeus.monitor import ZeusMonitor
from zeus.monitor.serving import EnergyLedger, RequestEnergy
from zeus.monitor.serving.metrics import DEFAULT_ENERGY_BUCKETS, ServingMetrics

WATTS = 300.0
STEP_S = 0.02


def samples(text: str, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples named `name` whose labels include `labels`."""
    return [
        (dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def value(text: str, name: str, **labels: str) -> float:
    """The one sample named `name` with exactly `labels` (besides `le`)."""
    found = [v for got, v in samples(text, name, **labels) if got == labels]
    assert len(found) == 1, f"expected one {name}{labels}, got {samples(text, name)}"
    return found[0]


def serve_requests(metrics: ServingMetrics) -> list[RequestEnergy]:
    """Six requests of two models and two tenants at 300 W, `d` still open at the close.

    Returns the ledger's records (what the callback saw, in order).
    """
    zeus.device.sim.set_power(0, WATTS)
    seen: list[RequestEnergy] = []

    def both(record: RequestEnergy) -> None:
        seen.append(record)
        metrics.observe(record)

    ledger = EnergyLedger(
        ZeusMonitor(gpu_indices=[0]), method="tokens", model="llama", callback=both
    )
    ledger.arrive("a", labels={"tenant": "x"})
    ledger.arrive("b", labels={"tenant": "y", "unused": "1"})
    ledger.arrive("c", model="qwen", labels={"tenant": "x"})
    ledger.arrive("d", labels={"tenant": "x"})
    ledger.arrive("e")  # no tenant: ""
    ledger.arrive("f", labels={"tenant": "x"})
    ids = ["a", "b", "c", "d", "e", "f"]
    prompts = [100, 40, 300, 60, 20, 80]
    zeus.device.sim.advance(STEP_S)
    ledger.end_step(ids, prompts, [0] * 6, prompts)
    for k in range(1, 20):
        zeus.device.sim.advance(STEP_S)
        ledger.end_step(ids, [0] * 6, [1] * 6, [p + k for p in prompts])
    for rid, tokens in (("a", 20), ("b", 12), ("c", 20), ("e", 0), ("f", 8)):
        ledger.finish(rid, output_tokens=tokens)
    totals = ledger.close()
    assert {r.request_id for r in seen} == set(ids)
    assert sum(r.energy for r in seen) == pytest.approx(totals.requests, rel=1e-9)
    return seen


def test_the_metrics_follow_the_ledgers_records(sim_gpus: Any) -> None:
    sim_gpus("H100")
    metrics = ServingMetrics(label_names=["tenant"])
    records = serve_requests(metrics)
    text = metrics.text()
    by_set: dict[tuple[str, str], list[RequestEnergy]] = {}
    for r in records:
        by_set.setdefault((r.model, r.labels.get("tenant", "")), []).append(r)
    assert set(by_set) == {("llama", "x"), ("llama", "y"), ("qwen", "x"), ("llama", "")}
    for (model, tenant), recs in by_set.items():
        labels = {"model": model, "tenant": tenant}
        done = [r for r in recs if r.finished]
        open_ = [r for r in recs if not r.finished]
        # The histogram and the output tokens: finished requests only.
        assert value(text, "zeus_serving_request_energy_joules_count", **labels) == len(done)
        assert value(text, "zeus_serving_request_energy_joules_sum", **labels) == pytest.approx(
            sum(r.energy for r in done), rel=1e-12
        )
        inf = value(text, "zeus_serving_request_energy_joules_bucket", **labels, le="+Inf")
        assert inf == len(done)
        for le in DEFAULT_ENERGY_BUCKETS:
            got = value(text, "zeus_serving_request_energy_joules_bucket", **labels, le=str(le))
            assert got == sum(r.energy <= le for r in done), (labels, le)
        tokens = sum(r.output_tokens for r in done)
        assert value(text, "zeus_serving_output_tokens_total", **labels) == tokens
        per_token = value(text, "zeus_serving_joules_per_output_token", **labels)
        if tokens:
            assert per_token == pytest.approx(sum(r.energy for r in done) / tokens, rel=1e-12)
        else:
            assert math.isnan(per_token)  # `e` generated no token
        # Every record counts in the requests and energy counters, by its finished state.
        for state, group in (("true", done), ("false", open_)):
            if not group:
                assert not samples(text, "zeus_serving_requests_total", **labels, finished=state)
                continue
            assert value(text, "zeus_serving_requests_total", **labels, finished=state) == len(
                group
            )
            assert value(
                text, "zeus_serving_energy_joules_total", **labels, finished=state
            ) == pytest.approx(sum(r.energy for r in group), rel=1e-12)
    # The open request `d` is nowhere but in the counters of every record.
    (d,) = [r for r in records if not r.finished]
    assert d.request_id == "d"
    assert value(
        text, "zeus_serving_request_energy_joules_count", model="llama", tenant="x"
    ) == len([r for r in by_set[("llama", "x")] if r.finished])
    # The label `unused` was not named: not exported.
    assert "unused" not in text
    # Tokens split a step's energy: `c`, with the longest prompt, spent the most.
    energy = {r.request_id: r.energy for r in records}
    assert max(energy, key=energy.__getitem__) == "c"
    assert sum(energy.values()) == pytest.approx(WATTS * STEP_S * 20, abs=5e-3)


def record(energy: float, tokens: float, finished: bool = True, **labels: str) -> RequestEnergy:
    return RequestEnergy(
        request_id="r",
        model="m",
        labels=labels,
        method="tokens",
        arrival=0.0,
        first_step=0.0,
        finish=1.0,
        finished=finished,
        energy=energy,
        energy_bound=0.0,
        prefill_energy=0.0,
        decode_energy=energy,
        gpu_energy={0: energy},
        prefill_tokens=0.0,
        decode_tokens=tokens,
        output_tokens=tokens,
        steps=1,
        mean_batch=1.0,
        fitted=True,
    )


def test_the_joules_per_token_gauge_covers_the_last_window_requests() -> None:
    metrics = ServingMetrics(window=2)

    def gauge() -> float:
        got = metrics.registry.get_sample_value(
            "zeus_serving_joules_per_output_token", {"model": "m"}
        )
        assert got is not None
        return float(got)

    metrics(record(10.0, 10))  # callable, as `observe`
    assert gauge() == 1.0
    metrics.observe(record(30.0, 10))
    assert gauge() == 2.0  # (10 + 30) / 20
    metrics.observe(record(5.0, 0))  # a request without output: its energy, no token
    assert gauge() == 3.5  # (30 + 5) / 10
    metrics.observe(record(100.0, 1, finished=False))  # unfinished: not in the gauge
    assert gauge() == 3.5
    metrics.observe(record(7.0, 0))
    assert math.isnan(gauge())  # the last two generated nothing
    text = metrics.text()
    assert value(text, "zeus_serving_request_energy_joules_count", model="m") == 4
    assert value(text, "zeus_serving_requests_total", model="m", finished="false") == 1
    assert value(text, "zeus_serving_energy_joules_total", model="m", finished="false") == 100


def test_each_metrics_object_has_its_own_registry_unless_given_one() -> None:
    a, b = ServingMetrics(), ServingMetrics()  # no clash
    assert a.registry is not b.registry
    shared = CollectorRegistry()
    c = ServingMetrics(registry=shared)
    assert c.registry is shared
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        ServingMetrics(registry=shared)
    c.observe(record(3.0, 3))
    assert "zeus_serving_request_energy_joules_count" in a.text() + c.text()
    assert 'zeus_serving_output_tokens_total{model="m"} 3.0' in c.text()
    assert "zeus_serving_output_tokens_total{" not in a.text()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"label_names": ["model"]}, "'model' is the metrics' own"),
        ({"label_names": ["finished"]}, "'finished' is the metrics' own"),
        ({"label_names": ["te-nant"]}, "'te-nant' is not a Prometheus label name"),
        ({"label_names": ["__x"]}, "'__x' is not a Prometheus label name"),
        ({"label_names": ["t", "t"]}, "label names repeat"),
        ({"buckets": [1.0, 1.0]}, "strictly ascending"),
        ({"buckets": []}, "at least one"),
        ({"window": 0}, "window must be an integer of at least 1, got 0"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServingMetrics(**kwargs)


def test_without_prometheus_client_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"pip install 'zeus-energy\[prometheus\]'"):
        ServingMetrics()


def test_serve_exposes_the_registry_until_closed() -> None:
    with ServingMetrics() as metrics:
        metrics.observe(record(2.5, 5))
        host, port = metrics.serve()
        assert host == "127.0.0.1" and port > 0
        assert metrics.address == (host, port)
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
            assert r.status == 200
            body = r.read().decode()
        assert 'zeus_serving_joules_per_output_token{model="m"} 0.5' in body
        assert body == metrics.text()
        with pytest.raises(RuntimeError, match=f"already serving on {host}:{port}"):
            metrics.serve()
    assert metrics.address is None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2)
    metrics.close()  # idempotent
    # Served again after a close, on a new port.
    _, again = metrics.serve()
    metrics.close()
    assert again > 0


def test_the_text_passes_promtool(sim_gpus: Any) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package `prometheus`; .ci/prometheus.sh)")
    sim_gpus("H100")
    metrics = ServingMetrics(label_names=["tenant"])
    serve_requests(metrics)
    body = metrics.text().encode()
    assert b"zeus_serving_request_energy_joules_bucket{" in body
    out = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
    assert out.returncode == 0, (out.stdout + out.stderr).decode()


def test_prometheus_scrapes_the_served_metrics(
    prometheus_factory: PrometheusFactory, sim_gpus: Any
) -> None:
    sim_gpus("H100")
    metrics = ServingMetrics(label_names=["tenant"])
    records = serve_requests(metrics)
    host, port = metrics.serve()
    try:
        prom = prometheus_factory(scrape={"serving": [f"{host}:{port}"]}, scrape_interval="1s")
        done = [
            r for r in records if r.finished and r.model == "llama" and r.labels == {"tenant": "x"}
        ]
        count = prom.wait_for(
            'zeus_serving_request_energy_joules_count{job="serving",model="llama",tenant="x"}'
        )
        assert [sample_value(s) for s in count] == [len(done)]
        total = prom.wait_for(
            'sum(zeus_serving_request_energy_joules_sum{job="serving"})',
            until=lambda res: bool(res) and sample_value(res[0]) > 0,
        )
        finished = [r for r in records if r.finished]
        assert sample_value(total[0]) == pytest.approx(sum(r.energy for r in finished), rel=1e-9)
        per_token = prom.wait_for(
            'zeus_serving_joules_per_output_token{job="serving",model="qwen",tenant="x"}'
        )
        (c,) = [r for r in records if r.model == "qwen"]
        assert sample_value(per_token[0]) == pytest.approx(c.energy / c.output_tokens, rel=1e-9)
        assert all(t["health"] == "up" for t in prom.targets())
    finally:
        metrics.close()
