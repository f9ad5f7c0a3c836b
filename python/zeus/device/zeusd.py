"""A client of zeusd, the privileged GPU daemon, and the switch that routes GPU writes to it.

Changing a GPU's power limit, locked clocks or persistence mode needs root (SYS_ADMIN); reading
them does not. With zeusd running as root on the node, an unprivileged process sets one of

- `ZEUSD_SOCK_PATH=/run/zeusd/zeusd.sock` (the daemon's Unix socket), or
- `ZEUSD_HOST_PORT=host:port` (the daemon in `--mode tcp`; `host` alone means port 4938),

and `zeus.device.get_gpus()` sends every GPU *write* to the daemon while reads stay direct
(NVML, in process: no round trip on the measurement path). `ZEUSD_TOKEN`, when set, is sent as
`Authorization: Bearer <token>`. Setting both address variables is an error (the reference
silently prefers the socket; a job that sets both was most likely configured twice, and
guessing which one was meant can send writes to the wrong node's daemon). An empty variable
counts as unset.

Nothing connects until the first write, so a process that only measures never notices a
stopped daemon; a malformed variable is reported at once, when `get_gpus()` builds the GPUs.

With the daemon, the *daemon* journals the original settings and restores them (see
`zeus.device.settings`): the client keeps no journal of its own. `httpx` is a base dependency
because the switch is made by the environment (often by whoever runs the node), not by the
code: an extra the user never chose would fail at the first write, in the middle of a job.
It is imported on first use, so `import zeus` does not pay for it.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import zeus.device.exception as _exceptions
from zeus.device.exception import (
    ZeusBaseGPUError,
    ZeusdConfigError,
    ZeusdConnectionError,
    ZeusdError,
    ZeusGPUInvalidArgError,
    ZeusGPUNoPermissionError,
    ZeusGPUNotSupportedError,
    ZeusGPUUnknownError,
)
from zeus.util import http
from zeus.util.indices import check_indices
from zeus.util.logging import get_logger

logger = get_logger(__name__)

if TYPE_CHECKING:
    import httpx

__all__ = ["DEFAULT_TCP_PORT", "ZeusdClient", "ZeusdConfig"]

DEFAULT_TCP_PORT = 4938
"""The port zeusd listens on in `--mode tcp` by convention (used when `ZEUSD_HOST_PORT` has
no port)."""

SOCK_VAR = "ZEUSD_SOCK_PATH"
HOST_PORT_VAR = "ZEUSD_HOST_PORT"
TOKEN_VAR = "ZEUSD_TOKEN"


def _env(environ: Mapping[str, str], name: str) -> Optional[str]:
    value = environ.get(name)
    return value if value else None


def parse_host_port(value: str, name: str = HOST_PORT_VAR) -> tuple[str, int]:
    """`host:port`, `host`, `[v6]:port` or `[v6]` (port 4938 when none is given).

    Raises:
        ZeusdConfigError: `value` is none of these; the message names it as `name`.

    """

    def bad(why: str) -> ZeusdConfigError:
        return ZeusdConfigError(
            f"{name}={value!r}: {why}; expected host:port (for example "
            f"localhost:{DEFAULT_TCP_PORT}) or a host alone (port {DEFAULT_TCP_PORT})"
        )

    text = value.strip()
    if "://" in text or "/" in text:
        raise bad("a host and a port, not a URL")
    if any(c.isspace() for c in text):
        raise bad("contains whitespace")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise bad("unclosed '['")
        host, rest = text[1:end], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise bad(f"unexpected {rest!r} after the IPv6 address")
        port_text: Optional[str] = rest[1:] if rest else None
    elif text.count(":") > 1:
        raise bad("an IPv6 address needs brackets, as in [::1]:4938")
    elif ":" in text:
        host, port_text = text.split(":", 1)
    else:
        host, port_text = text, None
    if not host:
        raise bad("no host")
    if port_text is None:
        return host, DEFAULT_TCP_PORT
    if not port_text.isdigit():
        raise bad(f"port {port_text!r} is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise bad(f"port {port} is outside 1-65535")
    return host, port


@dataclass(frozen=True)
class ZeusdConfig:
    """Where zeusd listens, the token to send, and which of its devices to stream.

    The address is a Unix socket or a TCP host and port; the devices matter only to
    `PowerStreamingClient`.

    Build one with `ZeusdConfig.tcp(host, port)`, `ZeusdConfig.uds(socket_path)` or
    `ZeusdConfig.from_env()`. It is the one address type of every zeusd client: the GPU-write
    switch, `ZeusdClient` and `PowerStreamingClient` (whose Zeus 0.16 names `ZeusdTcpConfig`
    and `ZeusdUdsConfig` build it too).

    Attributes:
        socket_path: The daemon's Unix socket, or None for TCP.
        host: The daemon's host (TCP), or None.
        port: The daemon's port (TCP; 4938 when not given), or None over a socket.
        token: Bearer token, or None.
        gpu_indices: The daemon's GPU indices to stream; None for all, `[]` for none.
        cpu_indices: The daemon's CPU package indices to stream; None for all (none where the
            node has no RAPL), `[]` for none.

    Raises:
        ValueError: both or neither of `socket_path` and `host`, an empty or padded host, a
            port that is not an int in 1-65535, an empty socket path, or a bad index list
            (each message names the value).

    """

    socket_path: Optional[str] = None
    host: Optional[str] = None
    port: Optional[int] = None
    token: Optional[str] = None
    gpu_indices: Optional[list[int]] = None
    cpu_indices: Optional[list[int]] = None

    def __post_init__(self) -> None:
        if (self.socket_path is None) == (self.host is None):
            raise ValueError("ZeusdConfig needs exactly one of socket_path and host")
        if self.host is not None:
            if not isinstance(self.host, str) or not self.host or self.host != self.host.strip():
                raise ValueError(f"host={self.host!r}: expected a host name or IP address")
            port = DEFAULT_TCP_PORT if self.port is None else self.port
            if isinstance(port, bool) or not isinstance(port, int):
                raise ValueError(f"port={port!r}: expected an int")
            if not 1 <= port <= 65535:
                raise ValueError(f"port={port}: outside 1-65535")
            object.__setattr__(self, "port", port)
        else:
            path = self.socket_path
            if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
                raise ValueError(f"socket_path={path!r}: expected a path")
            if self.port is not None:
                raise ValueError(f"port={self.port!r}: a Unix socket has no port")
            object.__setattr__(self, "socket_path", os.fspath(path))
        object.__setattr__(self, "gpu_indices", check_indices("gpu_indices", self.gpu_indices))
        object.__setattr__(self, "cpu_indices", check_indices("cpu_indices", self.cpu_indices))

    @classmethod
    def tcp(
        cls,
        host: str,
        port: int = DEFAULT_TCP_PORT,
        *,
        token: Optional[str] = None,
        gpu_indices: Optional[list[int]] = None,
        cpu_indices: Optional[list[int]] = None,
    ) -> ZeusdConfig:
        """A zeusd on `host:port` (`--mode tcp`); `token` None reads `ZEUSD_TOKEN`."""
        return cls(
            host=host,
            port=port,
            token=http.lookup_token(token, TOKEN_VAR),
            gpu_indices=gpu_indices,
            cpu_indices=cpu_indices,
        )

    @classmethod
    def uds(
        cls,
        socket_path: str,
        *,
        token: Optional[str] = None,
        gpu_indices: Optional[list[int]] = None,
        cpu_indices: Optional[list[int]] = None,
    ) -> ZeusdConfig:
        """A zeusd on this node's socket (`--mode uds`); `token` None reads `ZEUSD_TOKEN`."""
        return cls(
            socket_path=socket_path,
            token=http.lookup_token(token, TOKEN_VAR),
            gpu_indices=gpu_indices,
            cpu_indices=cpu_indices,
        )

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> Optional[ZeusdConfig]:
        """The configuration in the environment, or None when no daemon is configured.

        Raises:
            ZeusdConfigError: both `ZEUSD_SOCK_PATH` and `ZEUSD_HOST_PORT` are set, or
                `ZEUSD_HOST_PORT` is malformed (the message names the variable).

        """
        env = os.environ if environ is None else environ
        sock = _env(env, SOCK_VAR)
        host_port = _env(env, HOST_PORT_VAR)
        token = http.lookup_token(None, TOKEN_VAR, env)
        if sock is not None and host_port is not None:
            raise ZeusdConfigError(
                f"Both {SOCK_VAR}={sock!r} and {HOST_PORT_VAR}={host_port!r} are set; set only "
                f"one: {SOCK_VAR} for zeusd on this node's Unix socket, {HOST_PORT_VAR} for "
                "zeusd over TCP."
            )
        if sock is not None:
            return cls(socket_path=sock, token=token)
        if host_port is not None:
            host, port = parse_host_port(host_port)
            return cls(host=host, port=port, token=token)
        return None

    @property
    def variable(self) -> str:
        """The environment variable this kind of address comes from."""
        return SOCK_VAR if self.socket_path is not None else HOST_PORT_VAR

    @property
    def endpoint(self) -> str:
        """The address for messages: the socket path or `host:port`."""
        if self.socket_path is not None:
            return self.socket_path
        host = f"[{self.host}]" if self.host is not None and ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The URL prefix of requests (over a socket the host part is only a placeholder)."""
        if self.socket_path is not None:
            return "http://zeusd"
        return f"http://{self.endpoint}"

    def http_client(self, timeout: httpx.Timeout) -> httpx.Client:
        """A new `httpx.Client` for the daemon: its transport, base URL and bearer token."""
        headers = {}
        if self.socket_path is None:
            # Over TCP the daemon knows no pid: this names the process's lease, so that jobs
            # on one host (one IP address) do not share, and renew, each other's holds.
            headers["X-Zeusd-Client"] = _process_client_id()
        # trust_env=False: an HTTP(S)_PROXY meant for the internet must not carry the
        # daemon's requests (nor its token) through a proxy.
        return http.open_client(
            self.base_url,
            socket_path=self.socket_path,
            token=self.token,
            headers=headers,
            timeout=timeout,
            trust_env=False,
        )

    @property
    def key(self) -> str:
        """The server's name in `PowerStreamingClient` readings (Zeus 0.16): the endpoint."""
        return self.endpoint

    def __repr__(self) -> str:
        # Never print the token.
        parts = [f"{self.variable}={self.endpoint!r}"]
        if self.token is not None:
            parts.append("token=<set>")
        for name in ("gpu_indices", "cpu_indices"):
            value = getattr(self, name)
            if value is not None:
                parts.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


_client_id: Optional[tuple[int, str]] = None


def _process_client_id() -> str:
    """Name this process for the daemon's TCP leases.

    Host, pid and a random part (a new one after a fork).
    """
    global _client_id
    pid = os.getpid()
    if _client_id is None or _client_id[0] != pid:
        import secrets
        import socket

        _client_id = (pid, f"{socket.gethostname()}/{pid}/{secrets.token_hex(4)}")
    return _client_id[1]


# The hold connection's pauses between reconnections after a failure, and the silence (s)
# after which it is taken for dead (the daemon beats every 250 ms).
_HOLD_BACKOFF = http.Backoff(first_s=0.2, factor=2.0, max_s=2.0)
_HOLD_SILENCE = 5.0


def _ids(ids: Iterable[int], what: str = "GPU") -> str:
    values = [int(i) for i in ids]
    if not values:
        raise ZeusGPUInvalidArgError(f"no {what} index given")
    return ",".join(str(i) for i in values)


def _flag(value: bool) -> str:
    return "true" if value else "false"


class ZeusdClient:
    """Calls zeusd's HTTP API (the reference's paths, parameters and JSON shapes).

    GPU indices here are the daemon's (NVML indices on the node, not renumbered by the
    caller's `CUDA_VISIBLE_DEVICES`); `zeus.device.GPUs` translates its own indices. Errors map
    to the GPU exceptions: HTTP 400 `ZeusGPUInvalidArgError`, 401 and 403
    `ZeusGPUNoPermissionError`, 404 `ZeusGPUNotSupportedError` (the API group is disabled or
    the daemon is older), anything else `ZeusGPUUnknownError`; the daemon not answering
    `ZeusdConnectionError`. Safe to share between threads.

    Args:
        config: Where the daemon listens and the token; None reads the environment
            (`ZeusdConfig.from_env`, as Zeus 0.16's `ZeusdClient()` does).
        timeout: Seconds to wait for a reply (a blocking write can take a while on a busy GPU).
        purpose: Why this process talks to the daemon, for the message when it does not answer
            (for example "zeus.monitor.power_streaming streams power from it"). None: the GPU
            write switch (`ZEUSD_SOCK_PATH` / `ZEUSD_HOST_PORT`), whose message says how to
            start the daemon or unset the variable.

    Raises:
        ZeusdConnectionError: `config` is None and the environment names no daemon.
        ZeusdConfigError: `config` is None and the environment's variables are malformed.

    """

    def __init__(
        self,
        config: Optional[ZeusdConfig] = None,
        timeout: float = 30.0,
        purpose: Optional[str] = None,
    ) -> None:
        if config is None:
            config = ZeusdConfig.from_env()
            if config is None:
                raise ZeusdConnectionError(
                    f"No zeusd is configured: set {SOCK_VAR} or {HOST_PORT_VAR}, or pass a "
                    "ZeusdConfig (ZeusdConfig.uds(path) or ZeusdConfig.tcp(host, port))"
                )
        self.config = config
        self.timeout = timeout
        self.purpose = purpose
        self._client: Optional[httpx.Client] = None
        self._lock = threading.Lock()
        self._renewer: Optional[threading.Thread] = None
        # Set by each write over TCP, cleared by the lease thread when it looks: a write
        # racing the thread's decision that nothing is held keeps it holding.
        self._lease_wanted = False
        # Set while the hold connection is up (or the lease is renewed instead): a write
        # returns only then, so a job killed right after it still gets its original back.
        self._hold_ready = threading.Event()
        # No request is repeated: a write may have reached the daemon, and a read that fails
        # is retried by whoever asked (the sampler, the power stream's reconnection).
        self._service = http.Service(
            "zeusd",
            http.ErrorMap(
                transport=self._unreachable,
                status=self._status_error,
                body=self._not_json,
                success=(200,),
                # The message names the address and what is wrong with it.
                keep_cause=False,
            ),
        )

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> Optional[ZeusdClient]:
        """A client of the daemon the environment names, or None (see `ZeusdConfig.from_env`)."""
        config = ZeusdConfig.from_env(environ)
        return cls(config) if config is not None else None

    @property
    def endpoint(self) -> str:
        """The daemon's socket path or `host:port`."""
        return self.config.endpoint

    def __repr__(self) -> str:
        return f"ZeusdClient({self.config!r})"

    def close(self) -> None:
        """Close the connection (a later call opens a new one)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    # Endpoints that read.

    def discover(self) -> dict[str, Any]:
        """`GET /discover`: GPUs, CPUs, enabled API groups, whether auth is required."""
        return dict(self._request("GET", "/discover"))

    def time(self) -> float:
        """`GET /time`: the daemon's clock, UNIX seconds."""
        return float(self._request("GET", "/time")["timestamp_ms"]) / 1000.0

    def get_power_limit(self, gpu_ids: Optional[Iterable[int]] = None) -> dict[int, int]:
        """`GET /gpu/get_power_limit`: power limit per GPU, mW."""
        data = self._request("GET", "/gpu/get_power_limit", self._read_ids(gpu_ids))
        return {int(k): int(v["power_limit_mw"]) for k, v in data.items()}

    def get_power_limit_constraints(
        self, gpu_ids: Optional[Iterable[int]] = None
    ) -> dict[int, tuple[int, int]]:
        """`GET /gpu/get_power_limit_constraints`: (min, max) power limit per GPU, mW."""
        data = self._request("GET", "/gpu/get_power_limit_constraints", self._read_ids(gpu_ids))
        return {
            int(k): (int(v["min_power_limit_mw"]), int(v["max_power_limit_mw"]))
            for k, v in data.items()
        }

    def get_power(self, gpu_ids: Optional[Iterable[int]] = None) -> tuple[float, dict[int, int]]:
        """`GET /gpu/get_power`: (UNIX seconds, power per GPU in mW)."""
        data = self._request("GET", "/gpu/get_power", self._read_ids(gpu_ids))
        power = {int(k): int(v) for k, v in data["power_mw"].items()}
        return float(data["timestamp_ms"]) / 1000.0, power

    def get_cumulative_energy(self, gpu_ids: Optional[Iterable[int]] = None) -> dict[int, int]:
        """`GET /gpu/get_cumulative_energy`: energy counter per GPU, mJ."""
        data = self._request("GET", "/gpu/get_cumulative_energy", self._read_ids(gpu_ids))
        return {int(k): int(v["energy_mj"]) for k, v in data.items()}

    def get_cpu_power(
        self, cpu_ids: Optional[Iterable[int]] = None
    ) -> tuple[float, dict[int, tuple[int, Optional[int]]]]:
        """`GET /cpu/get_power`: (UNIX seconds, (package mW, DRAM mW or None) per CPU package)."""
        params = {} if cpu_ids is None else {"cpu_ids": _ids(cpu_ids, "CPU")}
        data = self._request("GET", "/cpu/get_power", params)
        power = {
            int(k): (int(v["cpu_mw"]), None if v.get("dram_mw") is None else int(v["dram_mw"]))
            for k, v in data["power_mw"].items()
        }
        return float(data["timestamp_ms"]) / 1000.0, power

    def get_persistence_mode(self, gpu_ids: Optional[Iterable[int]] = None) -> dict[int, bool]:
        """`GET /gpu/get_persistence_mode`: persistence mode per GPU."""
        data = self._request("GET", "/gpu/get_persistence_mode", self._read_ids(gpu_ids))
        return {int(k): bool(v["enabled"]) for k, v in data.items()}

    # Endpoints that write (root on the daemon's side).

    def set_power_limit(
        self, gpu_ids: Iterable[int], power_limit_mw: int, block: bool = True
    ) -> None:
        """`POST /gpu/set_power_limit`."""
        self._write("/gpu/set_power_limit", gpu_ids, block, power_limit_mw=str(int(power_limit_mw)))

    def set_persistence_mode(
        self, gpu_ids: Iterable[int], enabled: bool, block: bool = True
    ) -> None:
        """`POST /gpu/set_persistence_mode`."""
        self._write("/gpu/set_persistence_mode", gpu_ids, block, enabled=_flag(enabled))

    def set_gpu_locked_clocks(
        self, gpu_ids: Iterable[int], min_clock_mhz: int, max_clock_mhz: int, block: bool = True
    ) -> None:
        """`POST /gpu/set_gpu_locked_clocks` (graphics clock range, MHz)."""
        self._write(
            "/gpu/set_gpu_locked_clocks",
            gpu_ids,
            block,
            min_clock_mhz=str(int(min_clock_mhz)),
            max_clock_mhz=str(int(max_clock_mhz)),
        )

    def reset_gpu_locked_clocks(self, gpu_ids: Iterable[int], block: bool = True) -> None:
        """`POST /gpu/reset_gpu_locked_clocks`."""
        self._write("/gpu/reset_gpu_locked_clocks", gpu_ids, block)

    def set_mem_locked_clocks(
        self, gpu_ids: Iterable[int], min_clock_mhz: int, max_clock_mhz: int, block: bool = True
    ) -> None:
        """`POST /gpu/set_mem_locked_clocks` (memory clock range, MHz)."""
        self._write(
            "/gpu/set_mem_locked_clocks",
            gpu_ids,
            block,
            min_clock_mhz=str(int(min_clock_mhz)),
            max_clock_mhz=str(int(max_clock_mhz)),
        )

    def reset_mem_locked_clocks(self, gpu_ids: Iterable[int], block: bool = True) -> None:
        """`POST /gpu/reset_mem_locked_clocks`."""
        self._write("/gpu/reset_mem_locked_clocks", gpu_ids, block)

    def release(self, gpu_ids: Iterable[int], setting: str, block: bool = True) -> None:
        """`POST /gpu/release` (our extension): give back this client's hold of `setting`.

        `setting` is `"power_limit"` or `"clocks"`; the daemon restores it unless another
        client holds it too. Daemons without the endpoint (upstream's) raise
        `ZeusGPUNotSupportedError`.
        """
        self._write("/gpu/release", gpu_ids, block, setting=setting)

    def reset_locked_clocks(self, gpu_ids: Iterable[int], block: bool = True) -> None:
        """`POST /gpu/reset_locked_clocks` (graphics and memory)."""
        self._write("/gpu/reset_locked_clocks", gpu_ids, block)

    # Plumbing.

    @staticmethod
    def _read_ids(gpu_ids: Optional[Iterable[int]]) -> dict[str, str]:
        return {} if gpu_ids is None else {"gpu_ids": _ids(gpu_ids)}

    def _write(self, path: str, gpu_ids: Iterable[int], block: bool, **params: str) -> None:
        self._request("POST", path, {"gpu_ids": _ids(gpu_ids), **params, "block": _flag(block)})
        if self.config.socket_path is None:
            self._keep_lease()

    def _keep_lease(self) -> None:
        """Keep this process's TCP lease while it holds anything.

        Over TCP the daemon knows no process to watch. A daemon thread keeps a
        `GET /client/hold` connection open while the daemon says this process holds anything,
        and renews the lease at a third of its length (a connection cut off without a close,
        a network gone, then still ends with the lease): when the process ends, even by
        SIGKILL, its kernel closes the connection and the daemon restores its settings about a
        second later. Where no hold connection can be kept (a
        daemon older than the endpoint), the thread renews the lease at a third of its length
        instead, and a killed job's settings come back when the lease runs out.

        Returns once the connection is up (at most a few seconds), so that a job killed right
        after its write is restored too.
        """
        with self._lock:
            self._lease_wanted = True
            if self._renewer is None or not self._renewer.is_alive():
                self._renewer = threading.Thread(
                    target=self._hold_loop, name="zeusd-lease", daemon=True
                )
                self._renewer.start()
        if not self._hold_ready.wait(_HOLD_SILENCE):
            logger.warning(
                "zeusd at %s: no hold connection after %.0f s; the setting lasts as long as the "
                "daemon's lease unless the connection comes up",
                self.endpoint,
                _HOLD_SILENCE,
            )

    def _hold_loop(self) -> None:
        import httpx

        failures = 0
        while True:
            with self._lock:
                self._lease_wanted = False
            try:
                holds = self._hold_once()
            except ZeusGPUNotSupportedError:  # a daemon without the endpoint
                self._hold_ready.set()
                self._renew_loop()
                return
            except (httpx.HTTPError, ZeusBaseGPUError, ValueError) as e:
                # The daemon restarting, a dropped connection: the lease outlives a short
                # absence (the daemon's grace after a hold closes), so reconnect soon.
                self._hold_ready.clear()
                logger.debug("The zeusd hold connection failed: %s", e)
                time.sleep(_HOLD_BACKOFF.delay_s(failures))
                failures += 1
                continue
            self._hold_ready.clear()
            failures = 0
            if holds == 0:
                with self._lock:
                    # A write since the last look wants the lease kept: go on holding.
                    if not self._lease_wanted:
                        self._renewer = None
                        return

    def _hold_once(self) -> Optional[int]:
        """One hold connection, until it ends (None) or the daemon says nothing is held (0).

        The lease is renewed at a third of its length meanwhile.
        """
        import json

        # Beats come every 250 ms: a connection silent for seconds is dead.
        renewed = time.monotonic()
        with self.open_stream("/client/hold", timeout=http.timeouts(_HOLD_SILENCE)) as resp:
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[5:])
                self._hold_ready.set()
                if not isinstance(event, dict):
                    continue
                if event.get("holds") == 0:
                    return 0
                lease = event.get("lease_seconds")
                if isinstance(lease, (int, float)) and lease > 0:
                    if time.monotonic() - renewed >= max(0.2, float(lease) / 3.0):
                        self._request("POST", "/client/renew_lease", {})
                        renewed = time.monotonic()
        return None

    def _renew_loop(self) -> None:
        interval = 1.0
        while True:
            try:
                answer = self._request("POST", "/client/renew_lease", {})
            except ZeusBaseGPUError as e:  # a daemon without the endpoint, or unreachable
                logger.debug("Cannot renew the zeusd lease: %s", e)
                if isinstance(e, ZeusGPUNotSupportedError):
                    return
                time.sleep(interval)
                continue
            if not isinstance(answer, dict) or not answer.get("holds"):
                with self._lock:
                    if not self._lease_wanted:
                        self._renewer = None
                        return  # nothing held: the next write starts renewing again
                    self._lease_wanted = False
                continue
            lease = answer.get("lease_seconds")
            if isinstance(lease, (int, float)) and lease > 0:
                interval = max(0.2, float(lease) / 3.0)
            time.sleep(interval)

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                try:
                    import httpx  # noqa: F401  (only to say what is missing)
                except ImportError as e:  # pragma: no cover  (a base dependency)
                    raise ZeusdError(
                        f"{self.config.variable} is set, so GPU writes go through zeusd, which "
                        "needs the httpx package: pip install httpx (or reinstall zeus-energy "
                        "with its dependencies)"
                    ) from e
                self._client = self.config.http_client(http.timeouts(self.timeout))
            return self._client

    def open_stream(
        self,
        path: str,
        params: Optional[dict[str, str]] = None,
        timeout: Optional[httpx.Timeout] = None,
    ) -> AbstractContextManager[httpx.Response]:
        """`GET path`, a stream of server-sent events: the open response, closed on exit.

        Errors map as every request's (see the class); a failure while the events are read
        raises the `httpx` exception.

        Args:
            path: The endpoint (`/gpu/stream_power`, `/cpu/stream_power`, `/client/hold`).
            params: Its query parameters.
            timeout: The request's timeouts (the read timeout is the longest silence the
                stream may keep); None for the client's.

        """
        options: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        return self._service.stream(
            self._http(),
            "GET",
            path,
            params=params,
            headers={"Accept": "text/event-stream", "Cache-Control": "no-store"},
            **options,
        )

    def _unreachable(self, failure: http.Failure) -> ZeusdConnectionError:
        """The error for a daemon that does not answer: what is wrong with the address."""
        method, path, exc = failure.method, failure.path, failure.error
        where = f"{self.config.variable}={self.endpoint}" if self.purpose is None else self.endpoint
        hint = ""
        if self.config.socket_path is not None:
            sock = self.config.socket_path
            try:
                mode = os.stat(sock).st_mode
            except FileNotFoundError:
                hint = f"no such file: {sock}; "
            except OSError as e:
                hint = f"cannot stat {sock}: {e.strerror}; "
            else:
                if not stat.S_ISSOCK(mode):
                    hint = f"{sock} is not a socket; "
                elif not os.access(sock, os.R_OK | os.W_OK):
                    hint = f"{sock} is not writable by this user (see zeusd --socket-permissions); "
            start = f"zeusd serve --mode uds --socket-path {sock}"
        else:
            start = f"zeusd serve --mode tcp --tcp-bind-address {self.endpoint}"
        if failure.timed_out:
            limit = failure.timeout_s if failure.timeout_s is not None else self.timeout
            what = f"zeusd at {where} did not answer {method} {path} within {limit:g} s"
        else:
            what = f"Cannot reach zeusd at {where} ({hint}{type(exc).__name__}: {exc})"
        if self.purpose is not None:
            return ZeusdConnectionError(
                f"{what}. {self.purpose}: zeusd must be running there (for example `{start}`)."
            )
        return ZeusdConnectionError(
            f"{what}. GPU writes go through zeusd because {self.config.variable} is set: zeusd "
            f"must be running as root there (for example `{start}`), or unset "
            f"{self.config.variable} to write directly (which needs root)."
        )

    def _not_json(self, failure: http.Failure) -> ZeusdError:
        return ZeusdError(
            f"zeusd at {self.endpoint}: {failure.method} {failure.path} replied with non-JSON: "
            f"{failure.text[:200]!r}"
        )

    def _request(self, method: str, path: str, params: Optional[dict[str, str]] = None) -> Any:
        return self._service.send_json(self._http(), method, path, params=params, allow_empty=True)

    def _status_error(self, failure: http.Failure) -> ZeusBaseGPUError:
        method, path, resp = failure.method, failure.path, failure.response
        assert resp is not None  # a status failure has its answer
        code = resp.status_code
        detail = resp.text.strip()
        try:
            body = resp.json()
        except ValueError:
            body = None
        if isinstance(body, dict):
            if isinstance(body.get("errors"), dict):
                detail = "; ".join(f"daemon GPU {k}: {v}" for k, v in body["errors"].items())
            elif "error" in body:
                detail = str(body["error"])
        head = f"zeusd at {self.endpoint}: {method} {path} failed (HTTP {code})"
        message = f"{head}: {detail}" if detail else head
        # The daemon names the exception the failure raises in process (one table, in the
        # Rust core): the same class here. Answers of older daemons fall back on the status.
        named = _named_class(body)
        if named is not None and code != 401:
            return named(message)
        if code == 400:
            return ZeusGPUInvalidArgError(message)
        if code == 401:
            why = (
                f"the daemon requires a token and {TOKEN_VAR} is not set"
                if self.config.token is None
                else f"the daemon rejected the token in {TOKEN_VAR}"
            )
            return ZeusGPUNoPermissionError(f"{message} ({why})")
        if code == 403:
            return ZeusGPUNoPermissionError(message)
        if code == 404:
            return ZeusGPUNotSupportedError(
                f"{message} (the daemon does not serve it: its API group is not enabled "
                "(zeusd serve --enable) or the daemon predates the endpoint)"
            )
        return ZeusGPUUnknownError(message)


def _named_class(body: object) -> type[ZeusBaseGPUError] | None:
    """The exception class a daemon's error answer names, the first GPU's where several."""
    if not isinstance(body, dict) or not isinstance(body.get("classes"), dict):
        return None
    classes = body["classes"]
    for key in sorted(classes, key=lambda k: (len(str(k)), str(k))):
        cls = getattr(_exceptions, str(classes[key]), None)
        if isinstance(cls, type) and issubclass(cls, ZeusBaseGPUError):
            return cls
    return None
