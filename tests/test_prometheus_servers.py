"""The Prometheus and Pushgateway fixtures themselves (`tests/prometheus_servers.py`)."""

from __future__ import annotations

import pytest
from prometheus_servers import PrometheusFactory, Pushgateway, sample_value

prometheus_client = pytest.importorskip("prometheus_client")


def test_pushgateway_keeps_what_was_pushed(pushgateway: Pushgateway) -> None:
    registry = prometheus_client.CollectorRegistry()
    gauge = prometheus_client.Gauge(
        "zeus_fixture_gauge", "A test gauge", ["window"], registry=registry
    )
    gauge.labels(window="w").set(42.5)
    prometheus_client.push_to_gateway(pushgateway.address, job="selftest", registry=registry)

    assert pushgateway.value("zeus_fixture_gauge", job="selftest", window="w") == 42.5
    assert pushgateway.samples("zeus_fixture_gauge", job="other") == []

    pushgateway.wipe()
    assert pushgateway.samples("zeus_fixture_gauge") == []


def test_prometheus_scrapes_itself_and_the_pushgateway(
    pushgateway: Pushgateway, prometheus_factory: PrometheusFactory
) -> None:
    registry = prometheus_client.CollectorRegistry()
    gauge = prometheus_client.Gauge("zeus_fixture_gauge", "A test gauge", registry=registry)
    gauge.set(7.0)
    prometheus_client.push_to_gateway(pushgateway.url, job="selftest", registry=registry)

    prom = prometheus_factory(scrape={"pushgateway": [pushgateway.address]}, scrape_self=True)

    up = prom.wait_for('up{job="prometheus"} == 1')
    assert [sample_value(r) for r in up] == [1.0]

    # honor_labels: the pushed series keeps the job it was pushed under.
    pushed = prom.wait_for('zeus_fixture_gauge{job="selftest"}')
    assert len(pushed) == 1
    assert sample_value(pushed[0]) == 7.0

    gauge.set(9.0)
    prometheus_client.push_to_gateway(pushgateway.url, job="selftest", registry=registry)
    prom.wait_for(
        'zeus_fixture_gauge{job="selftest"}',
        until=lambda result: bool(result) and sample_value(result[0]) == 9.0,
    )
    assert {t["health"] for t in prom.targets()} == {"up"}


def test_wait_for_reports_what_it_saw(prometheus_factory: PrometheusFactory) -> None:
    prom = prometheus_factory(scrape_self=True)
    with pytest.raises(AssertionError, match="no_such_metric"):
        prom.wait_for("no_such_metric", timeout=0.5)


def test_a_configured_binary_that_is_missing_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    from prometheus_servers import PROMETHEUS_ENV, find_binary

    monkeypatch.setenv(PROMETHEUS_ENV, str(tmp_path / "nope"))
    with pytest.raises(pytest.fail.Exception, match="not an executable file"):
        find_binary(PROMETHEUS_ENV, ["prometheus"])
