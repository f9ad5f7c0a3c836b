"""Push energy and power measurements to a Prometheus Pushgateway (Zeus 0.16's `zeus.metric`).

It lives with the monitors it measures through; `zeus.metric` (Zeus 0.16's path) is an alias
of this module (`zeus._aliases`).

Three objects, each with `begin_window(name)` / `end_window(name)` like `ZeusMonitor`:

- `EnergyHistogram`: every closed window's energy per device is observed into a histogram and
  pushed when the window ends.
- `EnergyCumulativeCounter`: while a window is open, its energy is added to a counter every
  `update_period` seconds and pushed; the window's end adds and pushes the rest.
- `PowerGauge`: while a window is open, each GPU's power is pushed every `update_period` seconds.

They need the `prometheus-client` package (`pip install 'zeus-energy[prometheus]'`), imported only
when a metric is created.

Metric names and labels are Zeus 0.16's, so its dashboards and queries keep working: histogram
`energy_monitor_{gpu,cpu,dram}_energy_joules` (`_bucket`, `_sum`, `_count`), counter
`energy_monitor_{gpu,cpu,dram}_energy_joules_total`, gauge `power_monitor_gpu_power_watts`, each
with the labels `window` (the window name) and `index` (the device index), grouped in the
Pushgateway under `job`. As in Zeus, every push replaces the metrics of the whole `job` group
(`push_to_gateway`), so give each metric object a job of its own.

Differences from Zeus 0.16, all deliberate:

- The counter and the gauge are updated by one thread shared by every window of every metric
  (`zeus.monitor.slicer`, which also cuts `PeriodWindows`), instead of a spawned process per
  window, and pushed from a pusher thread; updates stop at `end_window` and, for windows still
  open, at interpreter exit (after a last push).
- One registry per metric object: concurrent windows of one object are pushed together instead of
  each window's push erasing the others' series.
- The counter counts exactly from `begin_window` to `end_window` (the last, partial period is
  added when the window ends), not in whole periods that may run past `end_window`. Reopening a
  window name continues its counter instead of restarting it from zero.
- `end_window` of the gauge removes that window's series from the Pushgateway, so a finished
  window no longer shows its last power reading forever.
- A push that fails in the background is logged (`logging`, once until pushes succeed again)
  rather than printed; `EnergyHistogram.end_window` raises as in Zeus.
- `EnergyHistogram.end_window` returns the window's `Measurement` (Zeus returns `None`), and
  warns only for energy above the largest bucket (Zeus also warns below the smallest one).
- `gpu_indices=None` means every visible GPU. Arguments are checked when the object is created,
  with errors naming the bad value.
- CPU and DRAM energy (`cpu_indices`) come from `ZeusMonitor(cpu_indices=...)` (RAPL, read in
  Rust; counter wraps are handled by the process's sampler thread, not by helper processes).
"""

from __future__ import annotations

import abc
import atexit
import functools
import logging
import math
import threading
import warnings
import weakref
from types import ModuleType
from typing import Any, Sequence
from urllib.parse import urlsplit

from zeus.device import get_gpus
from zeus.monitor import slicer
from zeus.monitor.energy import Measurement, ZeusMonitor
from zeus.monitor.power import PowerMonitor
from zeus.util.framework import imported_sync
from zeus.util.indices import check_indices

__all__ = ["EnergyCumulativeCounter", "EnergyHistogram", "Metric", "PowerGauge"]

# Zeus 0.16's logger name, which programs filter by.
logger = logging.getLogger("zeus.metric")

DEFAULT_GPU_BUCKETS = (50.0, 100.0, 200.0, 500.0, 1000.0)
DEFAULT_CPU_BUCKETS = (10.0, 50.0, 100.0, 500.0, 1000.0)
DEFAULT_DRAM_BUCKETS = (5.0, 10.0, 20.0, 50.0, 150.0)

# Seconds one push may take before it counts as failed.
PUSH_TIMEOUT_S = 10.0


def _quiet_counter_windows() -> None:
    """Ignore ZeusMonitor's short-window warning for the counter's own windows.

    The counter's last period is as short as the window's end makes it, so the warning would be
    noise there. Re-added at every counter `begin_window` in case the filters were reset.
    """
    warnings.filterwarnings(
        "ignore", message=r"Measurement window '__EnergyCumulativeCounter_", category=UserWarning
    )


_quiet_counter_windows()

_DESCRIPTIONS = {
    "gpu": "GPU energy consumption",
    "cpu": "CPU energy consumption",
    "dram": "DRAM energy consumption",
}


def _prometheus() -> ModuleType:
    try:
        import prometheus_client
    except ImportError as e:
        raise ImportError(
            "zeus.metric needs the prometheus-client package: pip install 'zeus-energy[prometheus]'"
        ) from e
    return prometheus_client


# ---- argument checks ------------------------------------------------------------------------


def _check_url(url: object) -> str:
    """The Pushgateway address as `push_to_gateway` takes it: `host:port` or an http(s) URL."""
    if not isinstance(url, str) or not url or any(c.isspace() for c in url):
        raise ValueError(
            f"pushgateway_url must be a Pushgateway address such as 'localhost:9091' or "
            f"'http://host:9091', got {url!r}"
        )
    full = url if "://" in url else f"http://{url}"
    parts = urlsplit(full)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"pushgateway_url must use http or https, got {url!r}")
    try:
        parts.port  # noqa: B018  (parsing the port is the check)
    except ValueError:
        raise ValueError(f"pushgateway_url has an invalid port: {url!r}") from None
    if not parts.hostname:
        raise ValueError(f"pushgateway_url has no host: {url!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"pushgateway_url must not have a query or fragment: {url!r}")
    return url


def _check_job(job: object) -> str:
    if not isinstance(job, str) or not job.strip():
        raise ValueError(f"job must be a non-empty string, got {job!r}")
    return job


def _check_period(update_period: object) -> float:
    if (
        isinstance(update_period, bool)
        or not isinstance(update_period, (int, float))
        or not math.isfinite(update_period)
        or update_period <= 0
    ):
        raise ValueError(f"update_period must be a number of seconds > 0, got {update_period!r}")
    return float(update_period)


def _check_buckets(what: str, buckets: object) -> list[float]:
    """Histogram upper bounds: >= 0, strictly increasing, finite but for a last `inf`."""
    if isinstance(buckets, (str, bytes)):
        raise ValueError(f"{what} must be a list of numbers, got {buckets!r}")
    try:
        values = list(buckets)  # type: ignore[call-overload]
    except TypeError:
        raise ValueError(f"{what} must be a list of numbers, got {buckets!r}") from None
    if not values:
        raise ValueError(f"{what} must not be empty (omit it for the defaults)")
    out: list[float] = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v < 0:
            raise ValueError(f"{what} must hold numbers >= 0, got {v!r} in {buckets!r}")
        out.append(float(v))
    for lo, hi in zip(out, out[1:]):
        if not lo < hi:
            raise ValueError(f"{what} must be strictly increasing, got {buckets!r}")
    if math.isinf(out[0]):
        raise ValueError(f"{what} needs a finite bound (the +Inf bucket is implied): {buckets!r}")
    return out


def _check_window_name(name: object) -> str:
    if not isinstance(name, str):
        raise ValueError(f"window name must be a string, got {name!r}")
    return name


# ---- measurement ----------------------------------------------------------------------------


def _check_devices(gpu_indices: list[int] | None, cpu_indices: list[int] | None) -> None:
    if gpu_indices == [] and not cpu_indices:
        raise ValueError("gpu_indices and cpu_indices are both empty: nothing to measure")


def _new_monitor(gpu_indices: list[int] | None, cpu_indices: list[int] | None) -> ZeusMonitor:
    return ZeusMonitor(gpu_indices=gpu_indices, cpu_indices=cpu_indices or None)


def _energies(measurement: Measurement) -> list[tuple[str, dict[int, float]]]:
    """`(kind, {index: joules})` for the GPU, CPU and DRAM energy the measurement has."""
    out = [("gpu", dict(measurement.gpu_energy))]
    for kind in ("cpu", "dram"):
        energy = getattr(measurement, f"{kind}_energy", None)
        if energy:
            out.append((kind, dict(energy)))
    return out


def _sync(gpu_indices: Sequence[int] | None) -> None:
    """Wait for the GPU work the framework queued on these GPUs (`None`: every visible one)."""
    sync = imported_sync()
    if sync is None:
        return
    indices = range(len(get_gpus())) if gpu_indices is None else gpu_indices
    for i in indices:
        sync(i)


# ---- pushing --------------------------------------------------------------------------------


class _Pusher:
    """One registry, pushed to one Pushgateway job; pushes are serialised."""

    def __init__(self, url: str, job: str) -> None:
        self.prom = _prometheus()
        self.url = url
        self.job = job
        self.registry = self.prom.CollectorRegistry()
        self._lock = threading.Lock()
        self._failing = False
        self._lock_soon = threading.Lock()
        self._wanted: str | None = None
        self._pushing = False

    def push(self) -> None:
        """Push the registry now; raises what `push_to_gateway` raises."""
        with self._lock:
            self.prom.push_to_gateway(
                self.url, job=self.job, registry=self.registry, timeout=PUSH_TIMEOUT_S
            )

    def push_soon(self, what: str) -> None:
        """Push from a pusher thread, not the caller's.

        Requests made while a push runs are served by one more push, not one each. Failures
        are logged as by `push_logged`.
        """
        with self._lock_soon:
            self._wanted = what
            if self._pushing:
                return
            self._pushing = True
        threading.Thread(target=self._push_wanted, name="zeus-metric-push", daemon=True).start()

    def _push_wanted(self) -> None:
        while True:
            with self._lock_soon:
                what, self._wanted = self._wanted, None
                if what is None:
                    self._pushing = False
                    return
            self.push_logged(what)

    def push_logged(self, what: str) -> bool:
        """Push; log a failure (once until a push succeeds again) instead of raising."""
        try:
            self.push()
        except Exception as e:
            if not self._failing:
                logger.warning(
                    "%s: push to the Pushgateway %s (job %r) failed: %s",
                    what,
                    self.url,
                    self.job,
                    e,
                )
            self._failing = True
            return False
        if self._failing:
            logger.warning("%s: pushes to %s succeed again", what, self.url)
        self._failing = False
        return True


class Metric(abc.ABC):
    """A Prometheus metric fed by measurement windows."""

    @abc.abstractmethod
    def begin_window(self, name: str, sync_execution: bool = True) -> None:
        """Start measurement window `name`.

        Args:
            name: Window name; it becomes the `window` label of the series.
            sync_execution: Wait for the GPU work queued by the framework first.

        """

    @abc.abstractmethod
    def end_window(self, name: str, sync_execution: bool = True) -> Any:
        """End measurement window `name` and push what it measured.

        Args:
            name: Window name given to `begin_window`.
            sync_execution: Wait for the GPU work queued by the framework first.

        """


# ---- EnergyHistogram ------------------------------------------------------------------------


class EnergyHistogram(Metric):
    """The energy of each window, per device, as Prometheus histograms.

    Every `end_window` observes the window's energy (joules) into
    `energy_monitor_gpu_energy_joules` (and the CPU and DRAM histograms when CPUs are measured)
    with labels `window` and `index`, and pushes the histograms to the Pushgateway.

    Example:
        >>> hist = EnergyHistogram(cpu_indices=[], gpu_indices=[0],
        ...                        pushgateway_url="localhost:9091", job="training")
        >>> hist.begin_window("step")
        >>> ...                                   # the code to measure
        >>> measurement = hist.end_window("step")

    Attributes:
        gpu_indices: Monitored GPUs (framework indices; every visible one if `None` was given).
        cpu_indices: Monitored CPUs.
        pushgateway_url: See the argument.
        job: See the argument.
        registry: The `prometheus_client.CollectorRegistry` pushed.
        energy_monitor: The `ZeusMonitor` measuring the windows.

    """

    def __init__(
        self,
        cpu_indices: Sequence[int],
        gpu_indices: Sequence[int] | None,
        pushgateway_url: str,
        job: str,
        gpu_bucket_range: Sequence[float] = DEFAULT_GPU_BUCKETS,
        cpu_bucket_range: Sequence[float] = DEFAULT_CPU_BUCKETS,
        dram_bucket_range: Sequence[float] = DEFAULT_DRAM_BUCKETS,
    ) -> None:
        """Check the arguments, set up the histograms and the energy monitor.

        Args:
            cpu_indices: CPUs (sockets) to measure; `[]` for none.
            gpu_indices: GPUs to measure (framework indices); `None` for every visible GPU.
            pushgateway_url: The Pushgateway: `host:port` or an `http(s)://` URL.
            job: The Pushgateway job the histograms are pushed under.
            gpu_bucket_range: Upper bounds (joules) of the GPU energy buckets.
            cpu_bucket_range: Upper bounds (joules) of the CPU energy buckets.
            dram_bucket_range: Upper bounds (joules) of the DRAM energy buckets.

        Raises:
            ValueError: An argument is invalid: bad indices, an empty or non-increasing bucket
                range, an empty job, a URL that is not an http(s) address.
            ImportError: prometheus-client is not installed.

        """
        cpus = check_indices("cpu_indices", cpu_indices) or []
        gpus = check_indices("gpu_indices", gpu_indices)
        self.pushgateway_url = _check_url(pushgateway_url)
        self.job = _check_job(job)
        self.buckets = {
            "gpu": _check_buckets("gpu_bucket_range", gpu_bucket_range),
            "cpu": _check_buckets("cpu_bucket_range", cpu_bucket_range),
            "dram": _check_buckets("dram_bucket_range", dram_bucket_range),
        }
        _check_devices(gpus, cpus)
        self._pusher = _Pusher(self.pushgateway_url, self.job)
        self.registry = self._pusher.registry
        self._histograms: dict[str, Any] = {}
        self.energy_monitor = _new_monitor(gpus, cpus)
        self.gpu_indices: list[int] = list(self.energy_monitor.gpu_indices)
        self.cpu_indices: list[int] = cpus
        if self.gpu_indices:
            self._histogram("gpu")
        self._open: set[str] = set()

    def _histogram(self, kind: str) -> Any:
        hist = self._histograms.get(kind)
        if hist is None:
            hist = self._pusher.prom.Histogram(
                f"energy_monitor_{kind}_energy_joules",
                _DESCRIPTIONS[kind],
                ["window", "index"],
                buckets=self.buckets[kind],
                registry=self.registry,
            )
            self._histograms[kind] = hist
        return hist

    def begin_window(self, name: str, sync_execution: bool = True) -> None:
        """Start measuring window `name`.

        Args:
            name: Window name (the `window` label).
            sync_execution: Wait for queued GPU work before the window starts.

        Raises:
            ValueError: A window of that name is already open.

        """
        _check_window_name(name)
        if name in self._open:
            raise ValueError(f"EnergyHistogram window {name!r} is already open")
        self.energy_monitor.begin_window(f"__EnergyHistogram_{name}", sync_cuda=sync_execution)
        self._open.add(name)

    def end_window(self, name: str, sync_execution: bool = True) -> Measurement:
        """End window `name`, observe its energy into the histograms and push them.

        Args:
            name: Window name given to `begin_window`.
            sync_execution: Wait for queued GPU work before the window ends.

        Returns:
            The window's measurement (time and energy per device).

        Raises:
            ValueError: No window of that name is open.
            Exception: Whatever the push raised (`OSError` and `urllib.error.URLError` when the
                Pushgateway cannot be reached); the observation stays in the registry and goes
                out with the next successful push.

        """
        _check_window_name(name)
        if name not in self._open:
            raise ValueError(f"EnergyHistogram window {name!r} is not open")
        self._open.discard(name)
        measurement = self.energy_monitor.end_window(
            f"__EnergyHistogram_{name}", sync_cuda=sync_execution
        )
        for kind, energies in _energies(measurement):
            hist = self._histogram(kind)
            top = self.buckets[kind][-1]
            for index, joules in energies.items():
                hist.labels(window=name, index=index).observe(joules)
                if joules > top:
                    warnings.warn(
                        f"{kind.upper()} {index} energy {joules} J of window {name!r} exceeds "
                        f"the largest {kind} bucket ({top} J); pass a wider {kind}_bucket_range",
                        stacklevel=2,
                    )
        self._pusher.push()
        return measurement


# ---- periodic metrics (counter, gauge) ------------------------------------------------------


class _Window:
    """An open window of a periodic metric: its schedule on the slicer and measuring object."""

    def __init__(self, name: str, source: Any) -> None:
        self.name = name
        self.source = source
        self.lock = threading.Lock()
        self.closed = False
        self.schedule: slicer.Schedule | None = None


# Periodic metrics with open windows, closed at interpreter exit.
_live: weakref.WeakSet[_PeriodicMetric] = weakref.WeakSet()


class _PeriodicMetric(Metric):
    """A metric whose open windows are updated periodically by the slicer thread and pushed."""

    _kind_name = "metric"

    gpu_indices: list[int] | None

    def __init__(self, update_period: float, pushgateway_url: str, job: str) -> None:
        self.update_period = _check_period(update_period)
        self.pushgateway_url = _check_url(pushgateway_url)
        self.job = _check_job(job)
        self._windows: dict[str, _Window] = {}
        self._windows_lock = threading.Lock()

    def _setup_pusher(self) -> None:
        self._pusher = _Pusher(self.pushgateway_url, self.job)
        self.registry = self._pusher.registry

    @property
    def open_windows(self) -> list[str]:
        """Names of the windows open now."""
        with self._windows_lock:
            return list(self._windows)

    def _start(self, name: str) -> Any:
        """Create the window's measuring object and take the window's first reading."""
        raise NotImplementedError

    def _update(self, window: _Window, final: bool) -> None:
        """Update the metric from the window's source (and close the source if `final`)."""
        raise NotImplementedError

    def _finish(self, window: _Window) -> None:
        """After the last update: release the source, adjust the registry."""

    # Whether a window is updated and pushed as soon as it starts (else a period later).
    _update_at_start = False

    def _tick(self, window: _Window) -> None:
        """On the slicer thread: update the metric (quick); the push goes to the pusher."""
        with window.lock:
            if window.closed:
                return
            try:
                self._update(window, final=False)
            except Exception:
                logger.exception("%s window %r: update failed", self._kind_name, window.name)
                return
        self._pusher.push_soon(f"{self._kind_name} window {window.name!r}")

    def begin_window(self, name: str, sync_execution: bool = False) -> None:
        """Start window `name`: the metric is updated and pushed every `update_period`.

        Args:
            name: Window name (the `window` label).
            sync_execution: Wait for queued GPU work before the window starts.

        Raises:
            ValueError: A window of that name is already open.

        """
        _check_window_name(name)
        with self._windows_lock:
            if name in self._windows:
                raise ValueError(f"{self._kind_name} window {name!r} is already open")
            if sync_execution:
                _sync(self.gpu_indices)
            window = _Window(name, self._start(name))
            self._windows[name] = window
            _live.add(self)
            window.schedule = slicer.every(
                self.update_period,
                functools.partial(self._tick, window),
                now=self._update_at_start,
            )

    def end_window(self, name: str, sync_execution: bool = False) -> None:
        """End window `name`: stop its updates, record the rest of the window and push.

        A push that fails is logged, not raised.

        Args:
            name: Window name given to `begin_window`.
            sync_execution: Wait for queued GPU work before the window ends.

        Raises:
            ValueError: No window of that name is open.

        """
        _check_window_name(name)
        with self._windows_lock:
            window = self._windows.pop(name, None)
        if window is None:
            raise ValueError(f"{self._kind_name} window {name!r} is not open")
        if sync_execution:
            _sync(self.gpu_indices)
        self._close(window)

    def _close(self, window: _Window) -> None:
        if window.schedule is not None:
            window.schedule.cancel()
        with window.lock:
            if not window.closed:
                self._update(window, final=True)
                window.closed = True
        self._finish(window)
        self._pusher.push_logged(f"{self._kind_name} window {window.name!r}")

    def _close_all(self) -> None:
        with self._windows_lock:
            windows = list(self._windows.values())
            self._windows.clear()
        for window in windows:
            try:
                self._close(window)
            except Exception:
                logger.exception("closing %s window %r", self._kind_name, window.name)


def _close_open_windows() -> None:
    for metric in list(_live):
        metric._close_all()


# Registered after zeus.monitor's own exit hook (which stops the energy sampler), so it runs
# first: open windows are measured to the end and pushed before the sampler goes.
atexit.register(_close_open_windows)


class EnergyCumulativeCounter(_PeriodicMetric):
    """Cumulative energy per device as Prometheus counters, pushed periodically.

    While window `name` is open, the slicer thread adds the energy of the last `update_period`
    seconds to `energy_monitor_gpu_energy_joules_total{window=name, index=i}` (and the CPU and
    DRAM counters when CPUs are measured) and pushes; `end_window` adds the rest of the window,
    so a window's total is its energy from `begin_window` to `end_window`.

    Example:
        >>> counter = EnergyCumulativeCounter(cpu_indices=[], gpu_indices=[0], update_period=5,
        ...                                   pushgateway_url="localhost:9091", job="train-energy")
        >>> counter.begin_window("training")
        >>> ...                                   # training; pushed every 5 s
        >>> counter.end_window("training")

    Attributes:
        gpu_indices: GPUs measured (framework indices; every visible one if `None` was given).
        cpu_indices: CPUs measured.
        update_period: Seconds between updates.
        registry: The `prometheus_client.CollectorRegistry` pushed.
        energy_monitor: The `ZeusMonitor` measuring the windows.

    """

    _kind_name = "EnergyCumulativeCounter"

    def __init__(
        self,
        cpu_indices: Sequence[int],
        gpu_indices: Sequence[int] | None,
        update_period: float,
        pushgateway_url: str,
        job: str,
    ) -> None:
        """Check the arguments and set up the counters.

        Args:
            cpu_indices: CPUs (sockets) to measure; `[]` for none.
            gpu_indices: GPUs to measure (framework indices); `None` for every visible GPU.
            update_period: Seconds between updates and pushes (> 0).
            pushgateway_url: The Pushgateway: `host:port` or an `http(s)://` URL.
            job: The Pushgateway job the counters are pushed under.

        Raises:
            ValueError: An argument is invalid.
            ImportError: prometheus-client is not installed.

        """
        self.cpu_indices: list[int] = check_indices("cpu_indices", cpu_indices) or []
        self.gpu_indices = check_indices("gpu_indices", gpu_indices)
        super().__init__(update_period, pushgateway_url, job)
        _check_devices(self.gpu_indices, self.cpu_indices)
        self._setup_pusher()
        self._counters: dict[str, Any] = {}
        # One monitor for every window (each its own key), created here so that a window starts
        # right at `begin_window`, and so that bad GPU indices fail here.
        self.energy_monitor = _new_monitor(self.gpu_indices, self.cpu_indices)
        self.gpu_indices = list(self.energy_monitor.gpu_indices)
        if self.gpu_indices:
            self._counter("gpu")

    def _counter(self, kind: str) -> Any:
        counter = self._counters.get(kind)
        if counter is None:
            counter = self._pusher.prom.Counter(
                f"energy_monitor_{kind}_energy_joules",
                _DESCRIPTIONS[kind],
                ["window", "index"],
                registry=self.registry,
            )
            self._counters[kind] = counter
        return counter

    def _key(self, name: str) -> str:
        return f"__EnergyCumulativeCounter_{name}"

    def _start(self, name: str) -> ZeusMonitor:
        _quiet_counter_windows()
        self.energy_monitor.begin_window(self._key(name), sync_cuda=False)
        return self.energy_monitor

    def _update(self, window: _Window, final: bool) -> None:
        monitor: ZeusMonitor = window.source
        key = self._key(window.name)
        # A cut: the next period starts from this period's end reads, so the increments add
        # up to the window's energy with nothing lost between periods.
        if final:
            measurement = monitor.end_window(key, sync_cuda=False)
        else:
            measurement = monitor.cut_window(key)
        for kind, energies in _energies(measurement):
            counter = self._counter(kind)
            for index, joules in energies.items():
                # A counter only goes up; a reading can dip a hair below the previous one.
                counter.labels(window=window.name, index=index).inc(max(joules, 0.0))


class PowerGauge(_PeriodicMetric):
    """GPU power as a Prometheus gauge, pushed periodically while a window is open.

    While window `name` is open, the slicer thread reads each GPU's latest power from a
    `PowerMonitor` every `update_period` seconds, sets
    `power_monitor_gpu_power_watts{window=name, index=i}` and pushes. `end_window` removes the
    window's series and pushes, so the Pushgateway stops reporting power for it.

    Example:
        >>> gauge = PowerGauge(gpu_indices=[0], update_period=1,
        ...                    pushgateway_url="localhost:9091", job="train-power")
        >>> gauge.begin_window("training")
        >>> ...
        >>> gauge.end_window("training")

    Attributes:
        gpu_indices: GPUs measured (`None`: every visible GPU).
        update_period: Seconds between pushes.
        registry: The `prometheus_client.CollectorRegistry` pushed.

    """

    _kind_name = "PowerGauge"

    def __init__(
        self,
        gpu_indices: Sequence[int] | None,
        update_period: float,
        pushgateway_url: str,
        job: str,
    ) -> None:
        """Check the arguments and set up the gauge.

        Args:
            gpu_indices: GPUs to measure (framework indices); `None` for every visible GPU.
            update_period: Seconds between readings and pushes (> 0).
            pushgateway_url: The Pushgateway: `host:port` or an `http(s)://` URL.
            job: The Pushgateway job the gauge is pushed under.

        Raises:
            ValueError: An argument is invalid.
            ImportError: prometheus-client is not installed.

        """
        self.gpu_indices = check_indices("gpu_indices", gpu_indices)
        if self.gpu_indices == []:
            raise ValueError("gpu_indices is empty: no GPU to measure")
        super().__init__(update_period, pushgateway_url, job)
        self._setup_pusher()
        self.gauge = self._pusher.prom.Gauge(
            "power_monitor_gpu_power_watts",
            "Records power consumption for GPU over time",
            ["window", "index"],
            registry=self.registry,
        )
        self._reported: dict[str, set[int]] = {}

    def _start(self, name: str) -> PowerMonitor:
        indices = None if self.gpu_indices is None else list(self.gpu_indices)
        monitor = PowerMonitor(gpu_indices=indices)
        monitor.sample_now()
        return monitor

    # The first reading goes out at once, not one period later.
    _update_at_start = True

    def _update(self, window: _Window, final: bool) -> None:
        if final:
            return
        monitor: PowerMonitor = window.source
        power = monitor.get_power() or {}
        reported = self._reported.setdefault(window.name, set())
        for index, watts in power.items():
            self.gauge.labels(window=window.name, index=index).set(watts)
            reported.add(index)

    def _finish(self, window: _Window) -> None:
        window.source.stop()
        for index in self._reported.pop(window.name, set()):
            try:
                self.gauge.remove(window.name, str(index))
            except KeyError:
                pass
