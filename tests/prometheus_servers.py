"""Real Prometheus and Pushgateway servers for tests (a pytest plugin, loaded by conftest.py).

Each server is the real binary (Debian's `prometheus` and `prometheus-pushgateway`, installed by
`.ci/prometheus.sh`) started on a free loopback port with its data under the test's temporary
directory, and stopped (terminate, then kill) when the test ends.

Binaries: `$ZEUS_TEST_PROMETHEUS` and `$ZEUS_TEST_PUSHGATEWAY` when set (CI sets them; a path that
does not run is an error), otherwise `prometheus` and `prometheus-pushgateway` (or `pushgateway`)
on PATH; when neither is found the test is skipped, naming the script that installs them.

Fixtures:
    pushgateway -> Pushgateway: a running Pushgateway (`.url`, `.address`, `.samples(...)`).
    prometheus_factory -> PrometheusFactory: `prometheus_factory(scrape={"job": ["host:port"]})`
        starts a Prometheus that scrapes those targets every second and returns a
        `PrometheusServer` (`.url`, `.query(expr)`, `.wait_for(expr)`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import pytest

PROMETHEUS_ENV = "ZEUS_TEST_PROMETHEUS"
PUSHGATEWAY_ENV = "ZEUS_TEST_PUSHGATEWAY"
INSTALL_HINT = (
    "install it with `.ci/prometheus.sh` (Debian packages prometheus, prometheus-pushgateway)"
)

Labels = Mapping[str, str]
Result = list[dict[str, Any]]


def find_binary(env: str, names: Sequence[str]) -> str:
    """Path of a server binary: `$env` if set (it must exist), else the first of `names` on PATH.

    Skips the calling test when the variable is unset and none is on PATH.
    """
    configured = os.environ.get(env)
    if configured:
        if not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
            pytest.fail(f"${env}={configured!r} is not an executable file")
        return configured
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    pytest.skip(f"{' / '.join(names)} not found (${env} unset, not on PATH); {INSTALL_HINT}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET `url`; return the status and body (HTTP errors included, not raised)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read()


class ServerProcess:
    """A server binary on a free loopback port; `start()` waits for its `/-/ready`."""

    name = "server"

    def __init__(self, binary: str, data_dir: Path) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / f"{self.name}.log"

    @property
    def address(self) -> str:
        """`127.0.0.1:PORT`, the form a scrape target takes."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`."""
        return f"http://{self.address}"

    def args(self) -> list[str]:
        """Command-line arguments after the binary (uses `self.port`)."""
        raise NotImplementedError

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        """Start on a free port (retried if it is taken meanwhile) and wait until ready."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        last_error = ""
        for _ in range(3):
            self.port = free_port()
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [self.binary, *self.args()],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.data_dir,
                )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    last_error = f"exited with {self.proc.returncode}"
                    break
                try:
                    status, _ = http_get(f"{self.url}/-/ready", timeout=1.0)
                    if status == 200:
                        return self
                except OSError:
                    pass
                time.sleep(0.05)
            else:
                self.stop()
                raise RuntimeError(
                    f"{self.name} not ready on {self.address} within {timeout} s; log:\n"
                    + self.log_tail()
                )
        raise RuntimeError(f"{self.name} failed to start ({last_error}); log:\n{self.log_tail()}")

    def stop(self) -> None:
        """Terminate the server (kill it if it does not exit within 10 s)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class Pushgateway(ServerProcess):
    """A Pushgateway keeping its pushed metrics in memory (and a throwaway persistence file)."""

    name = "pushgateway"

    def args(self) -> list[str]:
        return [
            f"--web.listen-address={self.address}",
            f"--persistence.file={self.data_dir / 'pushgateway.data'}",
            "--web.enable-admin-api",
            "--log.level=warn",
        ]

    def metrics_text(self) -> str:
        """The Pushgateway's `/metrics` page (everything pushed, plus its own metrics)."""
        status, body = http_get(f"{self.url}/metrics")
        assert status == 200, f"GET {self.url}/metrics: {status} {body[:500]!r}"
        return body.decode()

    def samples(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        """Samples named `name` (e.g. `x_bucket`, `x_total`) whose labels include `labels`.

        Returns `(labels, value)` pairs in the order the Pushgateway lists them.
        """
        from prometheus_client.parser import text_string_to_metric_families

        out: list[tuple[dict[str, str], float]] = []
        for family in text_string_to_metric_families(self.metrics_text()):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    out.append((dict(sample.labels), float(sample.value)))
        return out

    def value(self, name: str, **labels: str) -> float:
        """The one sample named `name` with `labels` (fails unless exactly one matches)."""
        found = self.samples(name, **labels)
        assert len(found) == 1, f"expected one {name}{labels} sample, got {found}"
        return found[0][1]

    def wait_for_samples(
        self, name: str, timeout: float = 10.0, **labels: str
    ) -> list[tuple[dict[str, str], float]]:
        """`samples(name, **labels)` once it is non-empty (polls; fails after `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.samples(name, **labels)
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert found, f"no {name}{labels} sample pushed within {timeout} s"
        return found

    def wipe(self) -> None:
        """Delete every pushed group (the admin API)."""
        req = urllib.request.Request(f"{self.url}/api/v1/admin/wipe", method="PUT")
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status in (200, 202), resp.status


class PrometheusServer(ServerProcess):
    """Prometheus scraping the given targets, with a generated configuration."""

    name = "prometheus"

    def __init__(
        self,
        binary: str,
        data_dir: Path,
        scrape: Mapping[str, Sequence[str]],
        scrape_interval: str = "1s",
        scrape_self: bool = False,
        rule_files: Sequence[os.PathLike[str] | str] = (),
    ) -> None:
        super().__init__(binary, data_dir)
        self.scrape = {job: list(targets) for job, targets in scrape.items()}
        self.scrape_interval = scrape_interval
        self.scrape_self = scrape_self
        self.rule_files = [os.fspath(Path(p).resolve()) for p in rule_files]
        self.config_path = data_dir / "prometheus.yml"

    def config(self) -> dict[str, Any]:
        """The configuration (written as JSON, which is YAML too)."""
        jobs = dict(self.scrape)
        if self.scrape_self:
            jobs.setdefault("prometheus", []).append(self.address)
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "rule_files": self.rule_files,
            "scrape_configs": [
                # honor_labels: series pushed to a Pushgateway keep their own `job`/`instance`.
                {"job_name": job, "honor_labels": True, "static_configs": [{"targets": targets}]}
                for job, targets in jobs.items()
            ],
        }

    def args(self) -> list[str]:
        self.config_path.write_text(json.dumps(self.config(), indent=2))
        return [
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir / 'tsdb'}",
            f"--web.listen-address={self.address}",
            "--log.level=warn",
        ]

    def api(self, path: str, **params: str) -> Any:
        """GET `/api/v1/{path}` with `params`; return its `data` (fails on an error answer)."""
        query = urllib.parse.urlencode(params)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        status, body = http_get(url)
        answer = json.loads(body)
        assert status == 200 and answer.get("status") == "success", f"GET {url}: {answer}"
        return answer["data"]

    def query(self, expr: str, at: float | None = None) -> Result:
        """Evaluate the instant PromQL query `expr` (now, or at epoch time `at`).

        Returns the result list: `[{"metric": {labels}, "value": [time, "value"]}, ...]` for a
        vector (use `sample_value` on an element).
        """
        params = {"query": expr}
        if at is not None:
            params["time"] = repr(at)
        data = self.api("query", **params)
        result = data["result"]
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": result}]
        return list(result)

    def query_range(self, expr: str, start: float, end: float, step: float) -> Result:
        """Evaluate `expr` over `[start, end]`: `[{"metric": {...}, "values": [[t, "v"], ...]}]`."""
        data = self.api(
            "query_range", query=expr, start=repr(start), end=repr(end), step=repr(step)
        )
        return list(data["result"])

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets with their health and last error."""
        return list(self.api("targets")["activeTargets"])

    def wait_for(
        self,
        expr: str,
        timeout: float = 30.0,
        until: Callable[[Result], bool] = bool,
    ) -> Result:
        """Query `expr` until `until(result)` holds (default: any series); return that result.

        Fails after `timeout` seconds with the last result and the targets' health.
        """
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if until(result):
                return result
            if time.monotonic() > deadline:
                health = [
                    (t["scrapeUrl"], t["health"], t.get("lastError", "")) for t in self.targets()
                ]
                raise AssertionError(
                    f"{expr!r} still gave {result} after {timeout} s; targets: {health}"
                )
            time.sleep(0.25)


def sample_value(item: Mapping[str, Any]) -> float:
    """The float value of one instant-vector element of `PrometheusServer.query`."""
    return float(item["value"][1])


PrometheusFactory = Callable[..., PrometheusServer]


@pytest.fixture
def pushgateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pushgateway]:
    """A running Pushgateway on a free loopback port, stopped after the test."""
    binary = find_binary(PUSHGATEWAY_ENV, ["prometheus-pushgateway", "pushgateway"])
    server = Pushgateway(binary, tmp_path_factory.mktemp("pushgateway"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def prometheus_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusFactory]:
    """Start Prometheus servers: `prometheus_factory(scrape={job: [targets]}, ...)`.

    Keyword arguments are `PrometheusServer`'s: `scrape` (job name -> `host:port` targets, all
    scraped with `honor_labels`), `scrape_interval` (default `"1s"`), `scrape_self`,
    `rule_files`. Every server started is stopped after the test.
    """
    binary = find_binary(PROMETHEUS_ENV, ["prometheus"])
    started: list[PrometheusServer] = []

    def start(
        scrape: Mapping[str, Sequence[str]] | None = None,
        scrape_interval: str = "1s",
        scrape_self: bool = False,
        rule_files: Sequence[os.PathLike[str] | str] = (),
    ) -> PrometheusServer:
        server = PrometheusServer(
            binary,
            tmp_path_factory.mktemp("prometheus"),
            scrape or {},
            scrape_interval=scrape_interval,
            scrape_self=scrape_self,
            rule_files=rule_files,
        )
        started.append(server)
        server.start()
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()
