"""The README's zeusd commands, run as written.

The block under "GPU control without root: zeusd" runs in a private mount namespace, with `/etc`,
`/var/lib` and `/run` overlaid, so that its `groupadd`, its unit file and the daemon's state touch
nothing outside the test. Two commands this machine lacks are shims on `PATH`: `sudo` runs its
command (the test is root), and `systemctl` does for the unit the block installed what systemd
would (its `RuntimeDirectory` and `StateDirectory`, then `ExecStart`, and for this test only,
waits for the socket). The job line runs `python train.py` as the user the block added to the
group, through `setpriv`; the job sets a power limit through the daemon and reads it back. The
daemon and the job share simulated GPUs (`ZEUS_SIM_SHARED`), as processes share a real one; the
simulated GPU refuses the unprivileged job's own writes, as a real one does.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOB_USER = "zeusreadme"
OTHER_PYTHON = "/usr/bin/python3"  # one another user can run (pyenv's lives under /root)

SUDO = """#!/bin/sh
exec "$@"
"""

# systemd is not PID 1 here: start the unit the way systemd would, for this test.
SYSTEMCTL = r"""#!/bin/bash
set -euo pipefail
case "$1" in
  daemon-reload) exit 0 ;;
  enable) ;;
  *) echo "systemctl shim: $* is not emulated" >&2; exit 1 ;;
esac
shift
[ "$1" = --now ] || { echo "systemctl shim: only 'enable --now' is emulated" >&2; exit 1; }
unit=/etc/systemd/system/$2.service
key() { sed -n "s/^$1=//p" "$unit"; }
install -d -m "$(key RuntimeDirectoryMode)" "/run/$(key RuntimeDirectory)"
install -d -m "$(key StateDirectoryMode)" "/var/lib/$(key StateDirectory)"
read -r -a cmd <<<"$(key ExecStart)"
setsid "${cmd[@]}" >"$WORK/daemon.log" 2>&1 </dev/null &
echo $! >"$WORK/daemon.pid"
sock=$(printf '%s\n' "${cmd[@]}" | sed -n '/^--socket-path$/{n;p}')
for _ in $(seq 200); do [ -S "$sock" ] && exit 0; sleep 0.05; done
echo "systemctl shim: $sock did not appear" >&2; cat "$WORK/daemon.log" >&2; exit 1
"""

# The job, as the unprivileged user the block added to the group, with zeus and its client's
# pure-Python dependencies on its path (this Python's own live under /root, unreadable to it).
PYTHON = """#!/bin/sh
exec setpriv --reuid="$(id -u "$USER")" --regid="$(id -g "$USER")" --init-groups \\
    env PYTHONPATH="$JOB_PATH" {python} "$@"
"""
CLIENT_DEPS = ("httpx", "httpcore", "h11", "anyio", "sniffio", "idna", "certifi")

TRAIN = """
from zeus.device import get_gpus
gpus = get_gpus()
gpus.set_power_management_limit(0, 150_000)
print("job limit", gpus.get_power_management_limit(0), flush=True)
"""

RUN = """
set -euo pipefail
for d in etc var/lib; do
    mkdir -p "$WORK/up/$d" "$WORK/work/$d"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$WORK/up/$d,workdir=$WORK/work/$d" "/$d"
done
mount -t tmpfs tmpfs /run
useradd -M -N "$USER"
trap 'kill -TERM "$(cat "$WORK/daemon.pid" 2>/dev/null)" 2>/dev/null; sleep 0.5' EXIT
cd "$WORK"
# ---- the README's block ----
{block}
# ---- after it: the daemon put the original back when the job exited ----
{check}
"""

CHECK = f"""
for _ in $(seq 100); do
    limit=$(env PYTHONPATH="$JOB_PATH" {OTHER_PYTHON} -c 'from zeus.device import get_gpus; \\
print(get_gpus().get_power_management_limit(0))')
    [ "$limit" = 300000 ] && {{ echo "restored $limit"; exit 0; }}
    sleep 0.1
done
echo "not restored: $limit"; exit 1
"""


def readme_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## GPU control without root: zeusd", 1)[1]
    m = re.search(r"```bash\n(.*?)```", section, re.S)
    assert m, "the zeusd section has a bash block"
    return m.group(1)


@pytest.fixture
def work() -> Iterator[Path]:
    """A directory the job's user can read (pytest's own are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="zeus-readme-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_the_readmes_zeusd_commands_work_as_written(work: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs the block's sudo lines as root in a private mount namespace")
    for tool in ("unshare", "setpriv", "useradd", "groupadd", "usermod"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    if not Path(OTHER_PYTHON).exists():
        pytest.skip(f"{OTHER_PYTHON} (a Python another user can run) is not installed")
    probe = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "env",
            f"PYTHONPATH={REPO / 'python'}",
            OTHER_PYTHON,
            "-c",
            "import zeus",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        pytest.skip(f"another user cannot import zeus from {REPO}: {probe.stderr[-300:]}")
    zeusd = shutil.which("zeusd")
    if zeusd is None:
        pytest.skip("no zeusd on PATH (pip install the package)")
    block = readme_block()
    bin_dir = work / "bin"
    bin_dir.mkdir()
    site = work / "site"
    for dep in CLIENT_DEPS:
        spec = importlib.util.find_spec(dep)
        if spec is None or spec.origin is None:
            pytest.skip(f"{dep} (a dependency of zeus's zeusd client) is not installed")
        shutil.copytree(Path(spec.origin).parent, site / dep)
    job_path = f"{REPO / 'python'}:{site}"
    python = PYTHON.format(python=OTHER_PYTHON)
    for name, body in (("sudo", SUDO), ("systemctl", SYSTEMCTL), ("python", python)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    (work / "train.py").write_text(TRAIN)
    script = work / "run.sh"
    script.write_text(RUN.format(block=block, check=CHECK))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUSD_", "ZEUS_"))}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        USER=JOB_USER,
        JOB_PATH=job_path,
        WORK=str(work),
        ZEUS_GPU_BACKEND="sim",
        ZEUS_SIM_GPUS="A40",
        ZEUS_SIM_FIDELITY="ideal",
        ZEUS_SIM_SHARED=str(work / "sim.state"),
    )
    groups_before = Path("/etc/group").read_text()
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    log = (work / "daemon.log").read_text() if (work / "daemon.log").exists() else ""
    out = f"{r.stdout}\n{r.stderr}\ndaemon log:\n{log}"
    if r.returncode != 0 and "mount" in r.stderr and "permission denied" in r.stderr.lower():
        pytest.skip(f"no private mounts here: {r.stderr[-300:]}")
    assert r.returncode == 0, out
    assert "job limit 150000" in r.stdout, out
    assert "restored 300000" in r.stdout, out
    assert Path("/etc/group").read_text() == groups_before, "the block touched the host's /etc"
