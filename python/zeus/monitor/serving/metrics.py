"""Prometheus metrics of an `EnergyLedger`'s records: energy per request and per output token.

`ServingMetrics` is a ledger callback: give its `observe` to the ledger, and it keeps, per
`model` and the label names chosen when it is made, the metrics below in a registry of its own,
which `serve()` exposes over HTTP for Prometheus to scrape (or `text()` returns).

```python
from zeus.monitor import ZeusMonitor
from zeus.monitor.serving import EnergyLedger
from zeus.monitor.serving.metrics import ServingMetrics

metrics = ServingMetrics(label_names=["tenant"])
host, port = metrics.serve(port=9400)          # http://127.0.0.1:9400/metrics
ledger = EnergyLedger(ZeusMonitor(gpu_indices=[0]), model="llama-3-8b",
                      callback=metrics.observe)
```

Metrics, each labelled `model` and the user label names:

- `zeus_serving_request_energy_joules` (histogram): each finished request's energy, J;
- `zeus_serving_output_tokens_total` (counter): output tokens of finished requests;
- `zeus_serving_joules_per_output_token` (gauge): J per output token of the last `window`
  finished requests;
- `zeus_serving_requests_total` (counter, also labelled `finished`): every record;
- `zeus_serving_energy_joules_total` (counter, also labelled `finished`): every record's
  energy, J.

(prometheus-client also exposes each histogram's and counter's `_created` time stamp.)

Finished and unfinished requests: a record with `finished=False` is a request still open when
the ledger closed; its energy is real, but it covers part of a request and the tokens it
generated so far. It counts in `zeus_serving_requests_total` and
`zeus_serving_energy_joules_total` (label `finished="false"`), and in nothing else: the
histogram, the output-token counter and the J/token gauge are of finished requests only, so
`rate(zeus_serving_request_energy_joules_sum[5m]) / rate(zeus_serving_output_tokens_total[5m])`
is the J per output token of finished requests over five minutes.

The gauge `zeus_serving_joules_per_output_token` is, per label set, the energy of the last
`window` finished requests (100 by default) over their output tokens: a ratio of sums, so
long requests weigh by their tokens (as `Aggregate.joules_per_output_token` does), and a
request that generated no token adds its energy and no token. It is NaN while those requests
generated no token at all, and absent for a label set before its first finished request.

Labels: `model` is the record's model; the other label names are fixed when the metrics are
made (`label_names`), each taking the value of the record's label of that name, or `""` where
the record has none. A record's labels not named are not exported. Each distinct label set is a
series in Prometheus: name only labels of few values (a tenant, an adapter), never a request id.

It needs the `prometheus-client` package (`pip install 'zeus-energy[prometheus]'`), imported when
a `ServingMetrics` is made.
"""

from __future__ import annotations

import math
import re
import socket
import threading
import wsgiref.simple_server
from collections import deque
from collections.abc import Sequence
from socketserver import ThreadingMixIn
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zeus.monitor.serving.ledger import RequestEnergy

__all__ = ["DEFAULT_ENERGY_BUCKETS", "DEFAULT_WINDOW", "ServingMetrics"]

# 0.1 J to 10 kJ in steps of 1, 2, 5 per decade: a short request of a small model at a large
# batch spends a fraction of a joule, a long one of a large model on several GPUs kilojoules.
DEFAULT_ENERGY_BUCKETS: tuple[float, ...] = (
    0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0,
    100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10_000.0,
)  # fmt: skip

# Finished requests per label set that the J/token gauge covers.
DEFAULT_WINDOW = 100

# Label names the metrics use themselves.
_RESERVED = ("model", "finished")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _prometheus() -> ModuleType:
    try:
        import prometheus_client
    except ImportError as e:
        raise ImportError(
            "zeus.monitor.serving.metrics needs the prometheus-client package: "
            "pip install 'zeus-energy[prometheus]'"
        ) from e
    return prometheus_client


class _ThreadingWSGIServer(ThreadingMixIn, wsgiref.simple_server.WSGIServer):
    """One thread per scrape, none of them keeping the process alive."""

    daemon_threads = True


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    """No line on stderr per scrape."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _host_port(server: wsgiref.simple_server.WSGIServer) -> tuple[str, int]:
    host, port = server.server_address[:2]
    return (host.decode() if isinstance(host, bytes) else str(host)), int(port)


class ServingMetrics:
    """Prometheus metrics of energy per request and per output token, fed by an `EnergyLedger`.

    Give `observe` to the ledger (`EnergyLedger(..., callback=metrics.observe)`); the object is
    also callable with a record. Records may arrive on the engine's thread while Prometheus
    scrapes from the server's threads.

    Example:
        ```python
        metrics = ServingMetrics(label_names=["tenant"])
        ledger = EnergyLedger(monitor, model="llama-3-8b", callback=metrics.observe)
        host, port = metrics.serve(port=9400)
        ...
        ledger.close()
        metrics.close()
        ```

    Attributes:
        registry: The `prometheus_client.CollectorRegistry` holding the metrics.
        label_names: The user label names, after `model` (and `finished` on the counters of
            every record).
        window: Finished requests per label set that the J/token gauge covers.

    """

    def __init__(
        self,
        label_names: Sequence[str] = (),
        *,
        registry: Any = None,
        buckets: Sequence[float] = DEFAULT_ENERGY_BUCKETS,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        """Make the metrics.

        Args:
            label_names: Names of the records' labels to export, besides `model`; a record
                without one gets `""`.
            registry: A `prometheus_client.CollectorRegistry` to register the metrics in;
                default a new one (so two `ServingMetrics` never clash, and `serve` exposes
                only these metrics).
            buckets: Upper bounds of the energy histogram's buckets, J, ascending (`+Inf` is
                added).
            window: How many of a label set's last finished requests the J/token gauge covers.

        Raises:
            ValueError: A label name that Prometheus does not allow, `model` or `finished`, a
                name given twice, bad buckets, or a window below 1.
            ImportError: prometheus-client is not installed.

        """
        names = [str(n) for n in label_names]
        for n in names:
            if not _LABEL_NAME.fullmatch(n) or n.startswith("__"):
                raise ValueError(
                    f"{n!r} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, not "
                    "starting with __)"
                )
            if n in _RESERVED:
                raise ValueError(f"label name {n!r} is the metrics' own; choose another")
        if len(set(names)) != len(names):
            raise ValueError(f"label names repeat: {names}")
        bounds = [float(b) for b in buckets]
        if not bounds or any(not math.isfinite(b) for b in bounds):
            raise ValueError(f"buckets must be finite and at least one, got {list(buckets)}")
        if any(b >= c for b, c in zip(bounds, bounds[1:])):
            raise ValueError(f"buckets must be strictly ascending, got {bounds}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer of at least 1, got {window!r}")

        prom = _prometheus()
        self._prom = prom
        self.registry = prom.CollectorRegistry() if registry is None else registry
        self.label_names: tuple[str, ...] = tuple(names)
        self.window = window
        labels = ["model", *names]
        self.request_energy = prom.Histogram(
            "zeus_serving_request_energy_joules",
            "Energy of each finished request, J (EnergyLedger)",
            labels,
            buckets=bounds,
            registry=self.registry,
        )
        self.output_tokens = prom.Counter(
            "zeus_serving_output_tokens",
            "Output tokens generated by finished requests",
            labels,
            registry=self.registry,
        )
        self.joules_per_output_token = prom.Gauge(
            "zeus_serving_joules_per_output_token",
            f"Energy per output token of the last {window} finished requests, J",
            labels,
            registry=self.registry,
        )
        self.requests = prom.Counter(
            "zeus_serving_requests",
            "Requests reported by the ledger (finished=false: still open when it closed)",
            [*labels, "finished"],
            registry=self.registry,
        )
        self.energy = prom.Counter(
            "zeus_serving_energy_joules",
            "Energy attributed to requests, J (finished=false: still open when it closed)",
            [*labels, "finished"],
            registry=self.registry,
        )
        self._lock = threading.Lock()
        # Per label values: (energy J, output tokens) of the last `window` finished requests.
        self._recent: dict[tuple[str, ...], deque[tuple[float, float]]] = {}
        self._server: wsgiref.simple_server.WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def label_values(self, record: RequestEnergy) -> tuple[str, ...]:
        """The record's values of `model` and `label_names`, in that order."""
        labels = record.labels or {}
        return (str(record.model), *(str(labels.get(n, "")) for n in self.label_names))

    def observe(self, record: RequestEnergy) -> None:
        """Count one record of the ledger (its `callback`)."""
        values = self.label_values(record)
        finished = bool(record.finished)
        energy = float(record.energy)
        self.requests.labels(*values, str(finished).lower()).inc()
        self.energy.labels(*values, str(finished).lower()).inc(max(energy, 0.0))
        if not finished:
            return
        tokens = float(record.output_tokens)
        self.request_energy.labels(*values).observe(energy)
        self.output_tokens.labels(*values).inc(max(tokens, 0.0))
        with self._lock:
            recent = self._recent.get(values)
            if recent is None:
                recent = self._recent[values] = deque(maxlen=self.window)
            recent.append((energy, tokens))
            total_j = sum(j for j, _ in recent)
            total_tokens = sum(n for _, n in recent)
            per_token = total_j / total_tokens if total_tokens > 0 else math.nan
            self.joules_per_output_token.labels(*values).set(per_token)

    def __call__(self, record: RequestEnergy) -> None:
        """`observe(record)`."""
        self.observe(record)

    def text(self) -> str:
        """The metrics in Prometheus's text format, as a scrape gets them."""
        return self._prom.generate_latest(self.registry).decode()

    def serve(self, port: int = 0, addr: str = "127.0.0.1") -> tuple[str, int]:
        """Serve the metrics over HTTP (any path, `/metrics` by convention) from a thread.

        Args:
            port: The TCP port; 0 picks a free one.
            addr: The address to listen on; `"0.0.0.0"` (or `"::"`) for every interface.

        Returns:
            The address and port listened on.

        Raises:
            RuntimeError: Already serving.
            OSError: The port is taken, or the address is not this host's.

        """
        served = self.address
        if served is not None:
            raise RuntimeError(f"already serving on {served[0]}:{served[1]}; close() first")

        # The server of `prometheus_client.start_http_server`, built here from its public WSGI
        # app: that function returns a handle to shut it down only from version 0.20 on.
        class Server(_ThreadingWSGIServer):
            address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET

        app = self._prom.make_wsgi_app(self.registry)
        server = wsgiref.simple_server.make_server(
            addr, port, app, server_class=Server, handler_class=_QuietHandler
        )
        # Polling every 0.1 s: `close` returns within that.
        thread = threading.Thread(
            target=server.serve_forever, args=(0.1,), name="zeus-serving-metrics", daemon=True
        )
        thread.start()
        self._server, self._thread = server, thread
        return _host_port(server)

    @property
    def address(self) -> tuple[str, int] | None:
        """The address and port `serve` listens on, or None when not serving."""
        return None if self._server is None else _host_port(self._server)

    def close(self) -> None:
        """Stop serving (if `serve` was called); idempotent. The metrics keep their values."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=10)

    def __enter__(self) -> ServingMetrics:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
