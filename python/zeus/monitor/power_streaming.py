"""Live GPU and CPU power from the zeusd daemons of many nodes, over server-sent events.

`PowerStreamingClient` (Zeus 0.16's API) keeps one connection per node and device kind to
zeusd's `/gpu/stream_power` and `/cpu/stream_power` and holds the latest power of every device:

```python
from zeus.monitor.power_streaming import PowerStreamingClient, ZeusdConfig

with PowerStreamingClient(
    servers=[
        ZeusdConfig.tcp("node1", gpu_indices=[0, 1]),
        ZeusdConfig.uds("/run/zeusd/zeusd.sock"),
    ],
) as client:
    client.get_power()  # {"node1:4938": PowerReadings(...), "/run/zeusd/zeusd.sock": ...}
    for readings in client:  # a snapshot each time new readings arrive
        ...
```

`zeus.monitor` itself measures the GPUs of this process; this is for watching whole nodes from
anywhere the daemons can be reached (a dashboard, a scheduler, a job that wants its neighbours'
draw), without root and without NVML on the watching machine.

What the reference leaves open, decided here:
- The constructor checks every server before any thread starts: unreachable, a token refused,
  an API group disabled, or a GPU/CPU index the node does not have, each raise at once with the
  server named. Readings are seeded from one plain read, so `get_power()` has values as soon as
  the constructor returns.
- A dropped connection is retried every `reconnect_delay_s` for as long as the client runs.
  While a stream is down its devices are *absent* from `get_power()`, rather than left at their
  last value: a sum over the snapshot never adds a dead node's stale watts as if they were now.
  The same holds for a single device the daemon reports an error for.
- `timestamp_s` is the daemon's clock (UNIX seconds) of the newest reading of that server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Optional

import httpx
from httpx_sse import EventSource

from zeus.device.exception import ZeusBaseGPUError
from zeus.device.zeusd import DEFAULT_TCP_PORT, ZeusdClient, ZeusdConfig
from zeus.util import http

__all__ = [
    "CpuPowerReading",
    "PowerReadings",
    "PowerStreamingClient",
    "ZeusdConfig",
    "ZeusdTcpConfig",
    "ZeusdUdsConfig",
]

logger = logging.getLogger(__name__)

READ_TIMEOUT_S = 30.0
"""A stream that sends nothing for this long is taken as dead and reconnected. zeusd sends
power at 10-20 Hz and an SSE keep-alive comment every 15 s, so a live stream never goes quiet
for this long."""

STOP_TIMEOUT_S = 5.0
"""How long `stop()` waits for all the stream threads together. A thread notices the stop at
its stream's next event (within 100 ms at zeusd's rates); one stuck on a hung daemon is a
daemon thread and ends at its read timeout."""


class ZeusdTcpConfig(ZeusdConfig):
    """Zeus 0.16's name for `ZeusdConfig.tcp(...)`: a zeusd listening on TCP.

    Args:
        host: Host name or IP address of the node.
        port: zeusd's port (4938 by convention).
        gpu_indices: The daemon's GPU indices to stream; None for all of them, `[]` for none.
        cpu_indices: The daemon's CPU package indices to stream; None for all (none when the
            node has no RAPL), `[]` for none.
        token: Bearer token for a daemon with auth on; None reads `ZEUSD_TOKEN`.

    """

    def __init__(
        self,
        host: str,
        port: int = DEFAULT_TCP_PORT,
        gpu_indices: Optional[list[int]] = None,
        cpu_indices: Optional[list[int]] = None,
        token: Optional[str] = None,
    ) -> None:
        like = ZeusdConfig.tcp(
            host, port, token=token, gpu_indices=gpu_indices, cpu_indices=cpu_indices
        )
        super().__init__(**vars(like))


class ZeusdUdsConfig(ZeusdConfig):
    """Zeus 0.16's name for `ZeusdConfig.uds(...)`: a zeusd on a Unix socket on this node.

    Args:
        socket_path: The daemon's socket.
        gpu_indices: As in `ZeusdTcpConfig`.
        cpu_indices: As in `ZeusdTcpConfig`.
        token: As in `ZeusdTcpConfig`.

    """

    def __init__(
        self,
        socket_path: str,
        gpu_indices: Optional[list[int]] = None,
        cpu_indices: Optional[list[int]] = None,
        token: Optional[str] = None,
    ) -> None:
        like = ZeusdConfig.uds(
            socket_path, token=token, gpu_indices=gpu_indices, cpu_indices=cpu_indices
        )
        super().__init__(**vars(like))


ServerConfig = ZeusdConfig
"""A server of `PowerStreamingClient`: `ZeusdConfig.tcp(...)`, `ZeusdConfig.uds(...)`, or
their Zeus 0.16 names."""


@dataclass
class CpuPowerReading:
    """Power of one CPU package.

    Both powers are means over the daemon's last two reads of the package's counters; on a
    busy machine the daemon skips ticks and the span grows, so compare them with anything
    over `since_s`..`until_s`, not over a fixed period.

    Attributes:
        cpu_w: Package power, W.
        dram_w: DRAM power, W, or None where the package has no DRAM zone.
        since_s: The daemon's clock (UNIX seconds) at the earlier read, or None where the
            figure is the zone's observed power (a stream's first) or the daemon did not say.
        until_s: The daemon's clock at the later read, or None where the daemon did not say.

    """

    cpu_w: float = 0.0
    dram_w: Optional[float] = None
    since_s: Optional[float] = None
    until_s: Optional[float] = None


@dataclass
class PowerReadings:
    """The latest power of one server's devices.

    Attributes:
        timestamp_s: The daemon's clock (UNIX seconds) at its newest reading.
        gpu_power_w: Power by the daemon's GPU index, W.
        cpu_power_w: Power by CPU package index.

    """

    timestamp_s: float = 0.0
    gpu_power_w: dict[int, float] = field(default_factory=dict)
    cpu_power_w: dict[int, CpuPowerReading] = field(default_factory=dict)

    def copy(self) -> PowerReadings:
        """A copy that later readings do not change."""
        return PowerReadings(
            self.timestamp_s,
            dict(self.gpu_power_w),
            {i: replace(r) for i, r in self.cpu_power_w.items()},
        )


@dataclass(frozen=True)
class _Stream:
    """One SSE connection: a server and a device kind, with the indices it carries."""

    server: ZeusdConfig
    kind: Literal["gpu", "cpu"]
    indices: tuple[int, ...]

    @property
    def label(self) -> str:
        return f"{self.kind.upper()} power stream of zeusd at {self.server.key}"


PURPOSE = "PowerStreamingClient streams power from it"


class PowerStreamingClient:
    """Streams the power of GPUs and CPUs from zeusd on one or more nodes.

    One background thread per server and device kind holds an SSE connection; the latest
    reading of every device is kept under a lock. Read it three ways: `get_power()` at any
    time, `for readings in client` (a snapshot each time new readings arrive, until `stop()`),
    or `async for readings in client` (the same without blocking the event loop). Use it as a
    context manager, or call `stop()`.

    Args:
        servers: The daemons, each with the devices to stream from it.
        reconnect_delay_s: Seconds between attempts to reconnect a dropped stream.

    Raises:
        ValueError: `servers` is empty or names one server twice, `reconnect_delay_s` is not
            positive, or a server lacks a requested GPU or CPU index or the API group it needs
            (`gpu-read`, `cpu-read`); the message names the server and the indices.
        zeus.device.exception.ZeusdConnectionError: a server does not answer (also a
            `ConnectionError`, as in the reference).
        zeus.device.exception.ZeusGPUNoPermissionError: a server needs a token and none was
            given, or refused the one given.

    """

    def __init__(self, servers: Sequence[ServerConfig], reconnect_delay_s: float = 1.0) -> None:
        servers = list(servers)
        if not servers:
            raise ValueError("servers is empty: name at least one zeusd to stream from")
        keys = [s.key for s in servers]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"servers names {', '.join(twice)} twice: give each server once")
        if not reconnect_delay_s > 0:
            raise ValueError(f"reconnect_delay_s={reconnect_delay_s!r}: expected seconds > 0")
        self._reconnect_delay_s = float(reconnect_delay_s)
        self._servers = servers
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._version = 0  # bumped on every change of the readings
        self._readings: dict[str, PowerReadings] = {}
        self._stopped = threading.Event()

        # Check every server before starting any thread: a bad one raises with nothing left
        # running.
        streams: list[_Stream] = []
        for server in servers:
            streams.extend(self._open(server))
        self._threads = [
            threading.Thread(
                target=self._run, args=(s,), name=f"zeus-{s.kind}-power-{s.server.key}", daemon=True
            )
            for s in streams
        ]
        for t in self._threads:
            t.start()

    @property
    def servers(self) -> list[ServerConfig]:
        """The servers this client streams from."""
        return list(self._servers)

    def get_power(self) -> dict[str, PowerReadings]:
        """The latest readings by server key (`host:port` or the socket path).

        A server whose streams are all down has no entry; a device whose stream is down or
        that the daemon reported an error for is missing from its server's readings.
        """
        with self._lock:
            return {k: r.copy() for k, r in self._readings.items()}

    def stop(self) -> None:
        """Close every stream and end the iterators. Calling it again does nothing."""
        self._stopped.set()
        with self._changed:
            self._changed.notify_all()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> PowerStreamingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __iter__(self) -> Iterator[dict[str, PowerReadings]]:
        """Snapshots as `get_power()` gives them, one each time readings change, until `stop()`.

        Readings that arrive while the loop body runs are merged into the next snapshot.
        """
        seen = self._current_version()
        while True:
            seen, snapshot = self._wait_newer(seen)
            if snapshot is None:
                return
            yield snapshot

    async def __aiter__(self) -> AsyncIterator[dict[str, PowerReadings]]:
        """`__iter__` for asyncio: the waiting happens in a worker thread."""
        seen = self._current_version()
        while True:
            seen, snapshot = await asyncio.to_thread(self._wait_newer, seen)
            if snapshot is None:
                return
            yield snapshot

    def __repr__(self) -> str:
        state = "stopped" if self._stopped.is_set() else "running"
        return f"PowerStreamingClient({[s.key for s in self._servers]!r}, {state})"

    # Inside.

    def _current_version(self) -> int:
        with self._lock:
            return self._version

    def _wait_newer(self, seen: int) -> tuple[int, Optional[dict[str, PowerReadings]]]:
        """Wait until the readings change past version `seen`.

        Returns (the new version, a snapshot), or (seen, None) once stopped.
        """
        with self._changed:
            while self._version == seen and not self._stopped.is_set():
                # A timeout, so that Ctrl-C reaches a main thread waiting here.
                self._changed.wait(timeout=1.0)
            if self._stopped.is_set():
                return seen, None
            return self._version, {k: r.copy() for k, r in self._readings.items()}

    def _open(self, server: ServerConfig) -> list[_Stream]:
        """Check `server` and read its devices once: the streams to start for it."""
        # The reads answer at once: a daemon that takes longer than a connection may is down.
        client = ZeusdClient(server, timeout=http.CONNECT_TIMEOUT_S, purpose=PURPOSE)
        try:
            info = client.discover()
            groups = set(info.get("enabled_api_groups", []))
            streams = []
            gpus = _chosen(
                server, "GPU", server.gpu_indices, [g["id"] for g in info["gpus"]], groups
            )
            if gpus:
                ts, power = client.get_power(gpus)
                for i, mw in power.items():
                    self._set(server.key, ts, gpu=(i, mw / 1000.0))
                streams.append(_Stream(server, "gpu", tuple(gpus)))
            cpus = _chosen(
                server, "CPU", server.cpu_indices, [c["id"] for c in info["cpus"]], groups
            )
            if cpus:
                ts, cpu_power = client.get_cpu_power(cpus)
                for i, (cpu_mw, dram_mw) in cpu_power.items():
                    self._set(server.key, ts, cpu=(i, _cpu_reading(cpu_mw, dram_mw)))
                streams.append(_Stream(server, "cpu", tuple(cpus)))
            return streams
        finally:
            client.close()

    def _run(self, stream: _Stream) -> None:
        """A stream thread: connect, apply events, and reconnect until stopped."""
        failures = 0
        while not self._stopped.is_set():
            try:
                self._follow(stream, http.timeouts(READ_TIMEOUT_S))
                if self._stopped.is_set():
                    return
                why = "the daemon ended it"
            # A refusal or no answer (the zeusd client's error map), or a stream broken
            # while read.
            except (httpx.HTTPError, ZeusBaseGPUError) as e:
                why = str(e) or type(e).__name__
            except Exception:
                # A bug here must not leave the thread dead and its last readings up forever.
                logger.exception("%s failed", stream.label)
                why = "an error in the client"
            self._forget(stream)
            failures += 1
            # The first failure of a streak is news; retries every second are not.
            level = logging.WARNING if failures == 1 else logging.DEBUG
            logger.log(
                level,
                "%s lost (%s); reconnecting every %g s",
                stream.label,
                why,
                self._reconnect_delay_s,
            )
            self._stopped.wait(self._reconnect_delay_s)

    def _follow(self, stream: _Stream, timeout: httpx.Timeout) -> None:
        """Read one connection of `stream` until it ends or the client stops."""
        params = {f"{stream.kind}_ids": ",".join(str(i) for i in stream.indices)}
        path = f"/{stream.kind}/stream_power"
        failing: set[int] = set()  # devices the daemon reported an error for, not yet cleared
        client = ZeusdClient(stream.server, purpose=PURPOSE)
        try:
            with client.open_stream(path, params, timeout) as response:
                logger.info("%s connected", stream.label)
                for event in EventSource(response).iter_sse():
                    if self._stopped.is_set():
                        return
                    self._apply(stream, event.event, event.data, failing)
        finally:
            client.close()

    def _apply(self, stream: _Stream, event: str, data: str, failing: set[int]) -> None:
        try:
            body = json.loads(data)
            ts = float(body["timestamp_ms"]) / 1000.0
            index = int(body[f"{stream.kind}_id"])
            if event == "error":
                if index not in failing:
                    failing.add(index)
                    logger.warning(
                        "%s: %s %d: %s", stream.label, stream.kind.upper(), index, body.get("error")
                    )
                self._drop(stream.server.key, stream.kind, [index])
                return
            if stream.kind == "gpu":
                self._set(stream.server.key, ts, gpu=(index, float(body["power_mw"]) / 1000.0))
            else:
                reading = _cpu_reading(body["cpu_mw"], body.get("dram_mw"))
                since_ms = body.get("since_ms")
                reading.since_s = None if since_ms is None else float(since_ms) / 1000.0
                reading.until_s = ts
                self._set(stream.server.key, ts, cpu=(index, reading))
        except (ValueError, KeyError, TypeError) as e:
            logger.warning("%s: ignored a malformed event %r (%s)", stream.label, data[:200], e)
            return
        failing.discard(index)

    def _set(
        self,
        key: str,
        timestamp_s: float,
        gpu: Optional[tuple[int, float]] = None,
        cpu: Optional[tuple[int, CpuPowerReading]] = None,
    ) -> None:
        with self._changed:
            readings = self._readings.setdefault(key, PowerReadings(timestamp_s))
            readings.timestamp_s = max(readings.timestamp_s, timestamp_s)
            if gpu is not None:
                readings.gpu_power_w[gpu[0]] = gpu[1]
            if cpu is not None:
                readings.cpu_power_w[cpu[0]] = cpu[1]
            self._version += 1
            self._changed.notify_all()

    def _drop(self, key: str, kind: str, indices: Sequence[int]) -> None:
        """Forget the readings of `indices` (of `kind`) of server `key`."""
        with self._changed:
            readings = self._readings.get(key)
            if readings is None:
                return
            table = readings.gpu_power_w if kind == "gpu" else readings.cpu_power_w
            if not any(i in table for i in indices):
                return
            for i in indices:
                table.pop(i, None)
            if not readings.gpu_power_w and not readings.cpu_power_w:
                del self._readings[key]
            self._version += 1
            self._changed.notify_all()

    def _forget(self, stream: _Stream) -> None:
        self._drop(stream.server.key, stream.kind, stream.indices)


def _cpu_reading(cpu_mw: float, dram_mw: Optional[float]) -> CpuPowerReading:
    return CpuPowerReading(float(cpu_mw) / 1000.0, None if dram_mw is None else dram_mw / 1000.0)


def _chosen(
    server: ServerConfig,
    what: Literal["GPU", "CPU"],
    requested: Optional[list[int]],
    present: list[int],
    groups: set[str],
) -> list[int]:
    """The indices of `what` to stream from `server`.

    The requested ones, checked against what the daemon has and serves; all it serves when
    None were requested.
    """
    group = f"{what.lower()}-read"
    served = present if group in groups else []
    if requested is None:
        return served
    if not requested:
        return []
    if group not in groups:
        raise ValueError(
            f"{what} indices {requested} requested for {server.key}, but zeusd there does not "
            f"serve {group} (enabled API groups: {', '.join(sorted(groups)) or 'none'})"
        )
    missing = [i for i in requested if i not in served]
    if missing:
        has = f"{what}s {served}" if served else f"no {what}s"
        if not served and what == "CPU":
            has += " (no readable RAPL on that node)"
        raise ValueError(
            f"{what} indices {missing} requested for {server.key}, but zeusd there has {has}"
        )
    return requested
