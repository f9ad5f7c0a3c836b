"""zeusd on zeus's AMD backend, with an unprivileged client of another user.

The daemon runs as root on the simulated `libamd_smi.so` (`ZEUS_GPU_BACKEND=amd`,
`ZEUS_AMDSMI_LIB`) with one MI300X (power cap 200-750 W, 750 W by default). The client runs as
uid/gid 65534 (`setpriv`), on the same library with `ZEUS_SIM_PRIVILEGED=0`, so that every write
it made itself would fail as it does for a real unprivileged process; its writes go through the
daemon's socket (`ZEUSD_SOCK_PATH`, group 65534, mode 660). Both share the board through
`ZEUS_SIM_SHARED`, as processes share a real GPU, and so does this test process, which opens
the same board in process to see what the daemon did to it.

The client is another user's process, so it runs a Python that user can run (`/usr/bin/python3`,
which must take this build's extension module) with zeus and its client's pure-Python
dependencies on its path, all under a directory that user can read. Everything is skipped, with
the reason, where that cannot be arranged or this process is not root.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import zeus.device.sim
from childproc import finish, stop
from zeus import _core
from zeusd_daemon import wait_answering, zeusd_bin

REPO = Path(__file__).resolve().parents[2]
OTHER_PYTHON = "/usr/bin/python3"  # one another user can run (pyenv's lives under /root)
CLIENT_ID = 65534  # nobody / nogroup
CLIENT_DEPS = ("httpx", "httpcore", "h11", "anyio", "sniffio", "idna", "certifi")
MI300X_MAX_MW = 750_000


def daemon_binary() -> Path:
    """`ZEUSD_BIN`, else the zeusd shipped in the package beside the simulated library, else
    the repository's build (`zeusd_daemon.zeusd_bin`, which skips when there is none)."""
    if os.environ.get("ZEUSD_BIN"):
        return zeusd_bin()
    bundled = REPO / "python" / "zeus" / "_bin" / "zeusd"
    return bundled if bundled.is_file() else zeusd_bin()


def amd_lib() -> Path:
    try:
        return zeus.device.sim.amdsmi_library_path()
    except FileNotFoundError as e:
        pytest.skip(f"the simulated libamd_smi.so is not built into the package: {e}")


@pytest.fixture(scope="module")
def client_python() -> Iterator[Path]:
    """A directory another user can read, with the client's dependencies under `site/`.

    Skips unless this process is root and user 65534 can import zeus's extension from there.
    """
    if os.geteuid() != 0:
        pytest.skip("zeusd's gpu-control API group needs root; these tests run it as root")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed (the client runs as another user through it)")
    if not Path(OTHER_PYTHON).exists():
        pytest.skip(f"{OTHER_PYTHON} (a Python another user can run) is not installed")
    work = Path(tempfile.mkdtemp(prefix="zeusd-amd-"))
    try:
        work.chmod(0o755)
        site = work / "site"
        for dep in CLIENT_DEPS:
            spec = importlib.util.find_spec(dep)
            if spec is None or spec.origin is None:
                pytest.skip(f"{dep} (a dependency of zeus's zeusd client) is not installed")
            shutil.copytree(Path(spec.origin).parent, site / dep)
        probe = subprocess.run(
            [*as_client(), "-c", "import zeus.device, zeus.device.zeusd, zeus._core"],
            env=client_env(work, {}),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if probe.returncode != 0:
            pytest.skip(f"user {CLIENT_ID} cannot import zeus from {REPO}: {probe.stderr[-300:]}")
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def work(client_python: Path) -> Iterator[Path]:
    """This test's directory, readable by the client's user (pytest's are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="test-", dir=client_python))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def as_client() -> list[str]:
    return [
        "setpriv",
        f"--reuid={CLIENT_ID}",
        f"--regid={CLIENT_ID}",
        "--clear-groups",
        OTHER_PYTHON,
    ]


def backend_env(backend: str, work: Path, fidelity: str = "ideal") -> dict[str, str]:
    """The simulated board's variables, the same in every process sharing it."""
    env = {"ZEUS_SIM_FIDELITY": fidelity, "ZEUS_SIM_SHARED": str(work / "sim.state")}
    if backend == "amd":
        env.update(ZEUS_GPU_BACKEND="amd", ZEUS_AMDSMI_LIB=str(amd_lib()), ZEUS_SIM_GPUS="MI300X")
    else:  # the NVIDIA counterpart, in-process simulator
        env.update(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="A100")
    return env


def client_env(site_root: Path, extra: dict[str, str]) -> dict[str, str]:
    """An environment of the client's own, not this process's (whose paths are root's)."""
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(site_root),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": f"{REPO / 'python'}:{site_root / 'site'}",
    }
    env.update(extra)
    return env


@dataclass
class AmdDaemon:
    """A running zeusd, a raw HTTP client to check it, and what a client needs to use it."""

    proc: subprocess.Popen[bytes]
    http: httpx.Client
    sock: Path
    state_dir: Path
    log_path: Path
    backend: str
    work: Path
    fidelity: str

    def board_env(self) -> dict[str, str]:
        """The board's variables, as the daemon has them."""
        return backend_env(self.backend, self.work, self.fidelity)

    def power_limit(self) -> int:
        """GPU 0's limit by the daemon's own `GET /gpu/get_power_limit`, mW."""
        r = self.http.get("/gpu/get_power_limit")
        assert r.status_code == 200, r.text
        return int(r.json()["0"]["power_limit_mw"])

    def log(self) -> str:
        return self.log_path.read_text()

    def journal(self) -> list[dict[str, Any]]:
        return list(_core.settings.journal_entries(self.state_dir))

    def client(self, code: str, stdin: bool = True) -> subprocess.Popen[str]:
        """Client code, as user 65534, on an unprivileged board, writing through this daemon."""
        env = self.board_env()
        env.update(
            ZEUS_SIM_PRIVILEGED="0",
            ZEUSD_SOCK_PATH=str(self.sock),
            ZEUS_STATE_DIR=str(self.work / "client-state"),
        )
        return subprocess.Popen(
            [*as_client(), "-c", PRELUDE + textwrap.dedent(code)],
            env=client_env(self.work.parent, env),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


PRELUDE = """
import json, os, sys
def report(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
"""


@contextmanager
def running_daemon(
    work: Path, backend: str = "amd", fidelity: str = "ideal"
) -> Iterator[AmdDaemon]:
    """zeusd as root over a Unix socket its clients' group may use, until the block ends."""
    sock = work / "zeusd.sock"
    state_dir = work / "daemon-state"
    log_path = work / "zeusd.log"
    args = [
        str(daemon_binary()),
        "serve",
        "--socket-path",
        str(sock),
        "--socket-gid",
        str(CLIENT_ID),
        "--state-dir",
        str(state_dir),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_", "ZEUSD_"))}
    env.update(backend_env(backend, work, fidelity), ZEUS_SIM_PRIVILEGED="1")
    http = httpx.Client(
        transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://zeusd", timeout=30
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    daemon = AmdDaemon(proc, http, sock, state_dir, log_path, backend, work, fidelity)
    try:
        wait_answering(proc, http, daemon.log, 60)
        yield daemon
    finally:
        http.close()
        stop(proc)


@pytest.fixture
def board(monkeypatch: pytest.MonkeyPatch, sim_gpus: Callable[..., Any]) -> Callable[..., Any]:
    """Open, in this process, the board a daemon in `work` runs on: its `GPUs`."""

    def open_board(daemon: AmdDaemon) -> Any:
        env = daemon.board_env()
        monkeypatch.setenv("ZEUS_SIM_SHARED", env["ZEUS_SIM_SHARED"])
        return sim_gpus(env["ZEUS_SIM_GPUS"], clock="real", fidelity=env["ZEUS_SIM_FIDELITY"])

    return open_board


def first_result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The client's first `RESULT` line (zeus logs to stdout too); fails if it ends first."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    proc.wait()
    err = proc.stderr.read() if proc.stderr else ""
    raise AssertionError(f"the client printed no result ({proc.returncode}): {seen}\n{err}")


def wait_until(condition: Callable[[], bool], within_s: float, what: Callable[[], str]) -> None:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < within_s, what()
        time.sleep(0.02)


@pytest.fixture
def clients() -> Iterator[list[subprocess.Popen[str]]]:
    """Client processes a test starts; any still running at its end is killed."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
        for stream in (p.stdin, p.stdout, p.stderr):
            if stream is not None:
                stream.close()


SET_CAP = """
from zeus import _core
from zeus.device import get_gpus
from zeus.device.exception import ZeusGPUNoPermissionError
gpus = get_gpus()
out = dict(
    uid=os.getuid(), gid=os.getgid(), pid=os.getpid(), backend=gpus.backend,
    name=gpus.get_name(0), through_zeusd=gpus.zeusd is not None,
    before=gpus.get_power_management_limit(0),
)
try:
    # The same write made directly, past the daemon: this process has no permission.
    _core.device.GPUs.set_power_management_limit(gpus, 0, 300_000)
    out["direct"] = "written"
except ZeusGPUNoPermissionError as e:
    out["direct"] = "ZeusGPUNoPermissionError: " + str(e)
gpus.set_power_management_limit(0, 400_000)
out["after"] = gpus.get_power_management_limit(0)  # a direct read of the shared board
report(**out)
sys.stdin.readline()
"""


@pytest.mark.parametrize("ending", ["exit", "sigkill"])
def test_unprivileged_client_sets_the_cap_and_zeusd_restores_it(
    ending: str,
    work: Path,
    board: Callable[..., Any],
    clients: list[subprocess.Popen[str]],
) -> None:
    with running_daemon(work) as daemon:
        gpus = board(daemon)
        assert daemon.power_limit() == gpus.get_power_management_limit(0) == MI300X_MAX_MW
        proc = daemon.client(SET_CAP)
        clients.append(proc)
        out = first_result(proc)
        assert (out["uid"], out["gid"]) == (CLIENT_ID, CLIENT_ID)
        assert (out["backend"], out["name"]) == ("amd", "AMD Instinct MI300X (Simulated)")
        assert out["through_zeusd"] and out["before"] == MI300X_MAX_MW
        assert out["direct"].startswith("ZeusGPUNoPermissionError"), out
        assert "AMDSMI_STATUS_NO_PERM" in out["direct"], out
        # The daemon set it: its own read, the client's and this process's see the new cap.
        assert out["after"] == 400_000
        assert daemon.power_limit() == 400_000
        assert gpus.get_power_management_limit(0) == 400_000
        # The daemon journaled the original in the client's name; the client journaled nothing.
        [entry] = daemon.journal()
        assert (entry["kind"], entry["uuid"]) == ("power_limit", gpus.get_uuid(0))
        assert (entry["power_limit_mw"], entry["pid"]) == (MI300X_MAX_MW, out["pid"])
        assert not (work / "client-state").exists()

        assert proc.stdin is not None
        if ending == "exit":
            proc.stdin.close()
            _, err = finish(proc)
            assert proc.returncode == 0, err
        else:
            proc.kill()
            finish(proc)
            assert proc.returncode < 0
        wait_until(
            lambda: daemon.power_limit() == MI300X_MAX_MW,
            30,
            lambda: f"cap still {daemon.power_limit()} mW after the client ended:\n{daemon.log()}",
        )
        assert gpus.get_power_management_limit(0) == MI300X_MAX_MW
        wait_until(lambda: daemon.journal() == [], 30, lambda: f"journal: {daemon.journal()}")
        # The daemon logs the release once the restore (cap and journal) is done: after what
        # the waits above saw, by a moment.
        released = f"released pid {out['pid']}, uid {CLIENT_ID}"
        wait_until(lambda: released in daemon.log(), 30, daemon.log)


ENERGY = """
import ctypes, time
import httpx
import zeus.device.sim
from zeus.device import get_gpus
from zeus.device.zeusd import ZeusdClient
gpus = get_gpus()
lib = ctypes.CDLL(str(zeus.device.sim.amdsmi_library_path()))

def truth():
    joules = ctypes.c_double()
    assert lib.zeusSimAmdTrueEnergy(0, ctypes.byref(joules)) == 0
    return joules.value

zeusd = ZeusdClient.from_env()
# The raw answer too, for its bound (`ZeusdClient` gives the energy alone).
raw = httpx.Client(
    transport=httpx.HTTPTransport(uds=os.environ["ZEUSD_SOCK_PATH"]), base_url="http://zeusd"
)

def served():
    # The truth just before and just after the request: the answer is of a moment between.
    before = truth()
    r = raw.get("/gpu/get_cumulative_energy", params={"gpu_ids": "0"})
    after = truth()
    r.raise_for_status()
    a = r.json()["0"]
    return a["energy_mj"] / 1000.0, a["uncertainty_mj"] / 1000.0, before, after

assert lib.zeusSimAmdSetBusy(0, 1) == 0
start = time.monotonic()
# The daemon's power reading follows the load once its sampler has seen it.
while zeusd.get_power([0])[1][0] < 450_000:
    assert time.monotonic() - start < 30, zeusd.get_power([0])
    time.sleep(0.02)
power = zeusd.get_power([0])[1][0]
pairs = []
for _ in range(3):
    e0, u0, b0, a0 = served()
    # Half a second of busy work (250 J) passes on the board.
    while truth() < a0 + 250:
        time.sleep(0.02)
    e1, u1, b1, a1 = served()
    # Served difference; the truth's least and most over the requests' spans; the bound.
    pairs.append((e1 - e0, b1 - a0, a1 - b0, u0 + u1))
client_mj = zeusd.get_cumulative_energy([0])[0]
report(power_mw=power, pairs=pairs, last_mj=e1 * 1000, client_mj=client_mj)
"""


def test_energy_through_zeusd_on_amd(
    work: Path, board: Callable[..., Any], clients: list[subprocess.Popen[str]]
) -> None:
    """The unprivileged client reads the busy board's power and energy through the daemon:
    differences of two answers are the board's energy between them, within the answers' own
    bounds (`uncertainty_mj`, about 1 J here) and 2%. (At `ZEUS_SIM_FIDELITY=ideal` the
    daemon's cache is looser, up to 8% on one second, within bounds near 100 J, on NVIDIA's
    simulated boards as well; the board here reads as a real one does.)"""
    with running_daemon(work, fidelity="real") as daemon:
        gpus = board(daemon)
        proc = daemon.client(ENERGY, stdin=False)
        clients.append(proc)
        out = first_result(proc)
        _, err = finish(proc)
        assert proc.returncode == 0, err
        # The client made the shared board busy; its busy power at the 750 W cap:
        watts = zeus.device.sim.true_power(0)
        assert zeus.device.sim.is_busy(0) and gpus.get_power_management_limit(0) == 750_000
    assert watts > 450
    assert out["power_mw"] / 1000 == pytest.approx(watts, rel=0.03)
    for served, low, high, bound in out["pairs"]:
        assert low >= 250
        assert 0.98 * low - bound <= served <= 1.02 * high + bound, out
        assert bound < 0.05 * low, out
    # zeus's own client reads the same counter, later.
    assert out["client_mj"] >= out["last_mj"]


CLOCK_HOLDER = """
from zeus.device import get_gpus
get_gpus().set_gpu_locked_clocks(0, 900, 900)
report(locked=True)
sys.stdin.readline()
"""

MEMORY_LOCK_AND_RESET = """
from zeus.device import get_gpus
gpus = get_gpus()
mem = max(gpus.get_supported_memory_clocks(0))
gpus.set_memory_locked_clocks(0, mem, mem)
gpus.reset_memory_locked_clocks(0)
report(reset=True)
"""


@pytest.mark.parametrize("backend", ["nvidia", "amd"])
def test_a_memory_clock_reset_keeps_another_clients_graphics_lock(
    backend: str,
    work: Path,
    board: Callable[..., Any],
    clients: list[subprocess.Popen[str]],
) -> None:
    """Client A locks the graphics clock; client B (same user) locks the memory clock and
    resets it. A still holds its lock, so the board must stay at A's clock."""
    with running_daemon(work, backend) as daemon:
        board(daemon)
        zeus.device.sim.set_busy(0)
        base = zeus.device.sim.steady_state(0)
        holder = daemon.client(CLOCK_HOLDER)
        clients.append(holder)
        assert first_result(holder) == {"locked": True}
        locked = zeus.device.sim.steady_state(0)
        assert locked[0] > base[0] * 1.2, (base, locked)
        other = daemon.client(MEMORY_LOCK_AND_RESET, stdin=False)
        clients.append(other)
        assert first_result(other) == {"reset": True}
        _, err = finish(other)
        assert other.returncode == 0, err
        assert holder.poll() is None
        assert zeus.device.sim.steady_state(0) == locked, daemon.log()
        # A's exit gives the board back.
        assert holder.stdin is not None
        holder.stdin.close()
        finish(holder)
        wait_until(
            lambda: zeus.device.sim.steady_state(0) == base,
            30,
            lambda: f"{zeus.device.sim.steady_state(0)} != {base}:\n{daemon.log()}",
        )
