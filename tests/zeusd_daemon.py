"""A real `zeusd` for tests: find the binary, run it as root on simulated GPUs, talk to it.

The daemon runs on the simulated GPUs `models`, shared through `ZEUS_SIM_SHARED` at
`tmp_path / "sim.state"` (`SIM_STATE`), so a client process opening the simulated GPUs with the
same file sees the same devices, as processes share a real GPU.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from childproc import stop

REPO = Path(__file__).resolve().parents[1]
SIM_STATE = "sim.state"


def zeusd_bin() -> Path:
    """`ZEUSD_BIN`, else `target/debug/zeusd` or `target/release/zeusd`; skip when none exists."""
    env = os.environ.get("ZEUSD_BIN")
    if env:
        if not Path(env).is_file():
            pytest.fail(f"ZEUSD_BIN={env} is not a file")
        return Path(env)
    for profile in ("debug", "release"):
        path = REPO / "target" / profile / "zeusd"
        if path.is_file():
            return path
    pytest.skip(
        "no zeusd binary: set ZEUSD_BIN, or build it (cargo build -p zeusd) so that "
        "target/debug/zeusd or target/release/zeusd exists"
    )


@dataclass
class Daemon:
    """A running zeusd and a raw HTTP client to check what it did."""

    proc: subprocess.Popen[bytes]
    env: dict[str, str]  # ZEUSD_SOCK_PATH or ZEUSD_HOST_PORT, for a client
    http: httpx.Client
    state_dir: Path
    log_path: Path

    def power_limits(self) -> dict[int, int]:
        """The daemon's own `GET /gpu/get_power_limit`, in mW by GPU index."""
        r = self.http.get("/gpu/get_power_limit")
        assert r.status_code == 200, r.text
        return {int(k): v["power_limit_mw"] for k, v in r.json().items()}

    def log(self) -> str:
        return self.log_path.read_text()


@contextmanager
def running_zeusd(
    tmp_path: Path,
    models: str,
    mode: str = "uds",
    extra: tuple[str, ...] = (),
    sim_cpus: int = 0,
) -> Iterator[Daemon]:
    """Run zeusd as root over `--mode` `uds` or `tcp` until the block ends (then SIGTERM).

    `sim_cpus` > 0 gives the daemon that many simulated CPU packages (`ZEUS_SIM_CPUS`).
    """
    binary = zeusd_bin()
    if os.geteuid() != 0:
        pytest.skip("zeusd's gpu-control API group needs root; these tests run it as root")
    state_dir = tmp_path / "daemon-state"
    log_path = tmp_path / f"zeusd-{mode}.log"
    args = [str(binary), "serve", "--mode", mode, "--state-dir", str(state_dir), *extra]
    if mode == "uds":
        sock = tmp_path / "zeusd.sock"
        args += ["--socket-path", str(sock)]
        client_env = {"ZEUSD_SOCK_PATH": str(sock)}
        http = httpx.Client(
            transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://zeusd", timeout=10
        )
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        args += ["--tcp-bind-address", f"127.0.0.1:{port}"]
        client_env = {"ZEUSD_HOST_PORT": f"127.0.0.1:{port}"}
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, trust_env=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUSD_", "ZEUS_SIM_"))}
    env.update(
        ZEUS_GPU_BACKEND="sim",
        ZEUS_SIM_GPUS=models,
        ZEUS_SIM_PRIVILEGED="1",
        ZEUS_SIM_FIDELITY="ideal",
        ZEUS_SIM_SHARED=str(tmp_path / SIM_STATE),
    )
    if sim_cpus:
        env["ZEUS_SIM_CPUS"] = str(sim_cpus)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
        daemon = Daemon(proc, client_env, http, state_dir, log_path)
        try:
            wait_answering(proc, http, daemon.log, 20)
            yield daemon
        finally:
            http.close()
            stop(proc, 10)


def wait_answering(
    proc: subprocess.Popen[Any], http: httpx.Client, log: Callable[[], str], seconds: float
) -> None:
    """Wait until zeusd (`proc`, reached through `http`) answers `/discover`; fail the test
    with its output (`log()`) if it exits or has not answered within `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            pytest.fail(f"zeusd exited ({proc.returncode}):\n{log()}")
        try:
            if http.get("/discover").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"zeusd did not answer within {seconds} s:\n{log()}")
        time.sleep(0.05)


def issue_token(key: Path, scope: str, user: str = "alice") -> str:
    """`zeusd token issue` with signing key `key` for `user` and `scope`, valid for an hour."""
    out = subprocess.run(
        [str(zeusd_bin()), "token", "issue", "--signing-key-path", str(key), "--user", user]
        + ["--scope", scope, "--expires", "1h"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()
