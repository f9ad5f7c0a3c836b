"""The systemd units `zeusd unit` and `zeus-monitor unit` write: they name the real binary
(not the Python launcher `pip install` puts on PATH), and `systemd-analyze verify` accepts them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

BIN_DIR = Path(__file__).resolve().parents[2] / "python" / "zeus" / "_bin"


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None and (BIN_DIR / name).exists():
        return str(BIN_DIR / name)
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


def _exec_start(unit: str) -> list[str]:
    line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    return line.removeprefix("ExecStart=").split()


def _verify(tmp_path: Path, name: str, unit: str) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    path = tmp_path / name
    path.write_text(unit)
    r = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(
    ("tool", "unit_name"), [("zeusd", "zeusd.service"), ("zeus-monitor", "zeus-monitor.service")]
)
def test_units_name_the_real_binary_and_verify(tmp_path: Path, tool: str, unit_name: str) -> None:
    out = subprocess.run(
        [_tool(tool), "unit"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    exe = Path(_exec_start(out)[0])
    assert exe.is_absolute() and os.access(exe, os.X_OK), exe
    # The binary itself (ELF), not a Python launcher script.
    assert exe.read_bytes()[:4] == b"\x7fELF", exe
    assert "LimitNOFILE=" in out
    _verify(tmp_path, unit_name, out)


def test_the_zeusd_unit_admits_a_group_by_gid_and_names_a_missing_group(tmp_path: Path) -> None:
    zeusd = _tool("zeusd")
    out = subprocess.run(
        [zeusd, "unit", "--socket-group", "root"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    cmd = _exec_start(out)
    assert cmd[cmd.index("--socket-gid") + 1] == "0"
    assert cmd[cmd.index("--socket-permissions") + 1] == "660"
    assert "RuntimeDirectory=zeusd" in out
    _verify(tmp_path, "zeusd.service", out)
    bad = subprocess.run(
        [zeusd, "unit", "--socket-group", "no-such-group-zeus"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1
    assert "groupadd no-such-group-zeus" in bad.stderr, bad.stderr


def test_a_missing_socket_directory_is_named_with_the_fix(tmp_path: Path) -> None:
    env = {**os.environ, "ZEUS_GPU_BACKEND": "sim", "ZEUS_SIM_CLOCK": "virtual"}
    r = subprocess.run(
        [
            _tool("zeusd"),
            "serve",
            "--socket-path",
            str(tmp_path / "run" / "zeusd" / "zeusd.sock"),
            "--state-dir",
            str(tmp_path / "state"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 1
    assert f"the directory {tmp_path / 'run' / 'zeusd'} does not exist" in r.stderr, r.stderr
    assert "zeusd unit" in r.stderr
