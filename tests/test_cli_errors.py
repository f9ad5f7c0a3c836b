"""Every console entry point fails in one line of error plus one line of hint, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

NO_NVML = {"ZEUS_NVML_LIB": "/nonexistent/libnvidia-ml.so.1"}
SIM = {"ZEUS_GPU_BACKEND": "sim", "ZEUS_SIM_FIDELITY": "ideal"}
PERSEUS_WITHOUT_UVICORN = (
    "import sys; sys.modules['uvicorn'] = None; "
    "from zeus.optimizer.perseus.server.cli import main; sys.exit(main(['--port', '18127']))"
)
WITHOUT_UVICORN = (
    "import sys; sys.modules['uvicorn'] = None; "
    "from zeus.optimizer.batch_size.server.cli import main; sys.exit(main(['--port', '18123']))"
)

CASES = {
    "bso port out of range": (
        ["-m", "zeus.optimizer.batch_size.server.cli", "--port", "99999"],
        {},
        2,
        "port must be from 1 to 65535, got 99999",
    ),
    "bso port not a number": (
        ["-m", "zeus.optimizer.batch_size.server.cli", "--port", "http"],
        {},
        2,
        "not a port number",
    ),
    "bso sqlite path": (
        [
            "-m",
            "zeus.optimizer.batch_size.server.cli",
            "--port",
            "18124",
            "--database-url",
            "sqlite+aiosqlite:////nonexistent/dir/zeus.db",
        ],
        {},
        1,
        "/nonexistent/dir/zeus.db",
    ),
    "bso without its extra": (
        ["-c", WITHOUT_UVICORN],
        {},
        1,
        "'uvicorn' is not installed",
    ),
    "bso bad host": (
        ["-m", "zeus.optimizer.batch_size.server.cli", "--host", "no such host!"],
        {},
        2,
        "not an address this machine can bind",
    ),
    "bso bad database URL": (
        [
            "-m",
            "zeus.optimizer.batch_size.server.cli",
            "--port",
            "18126",
            "--database-url",
            "mysql://x/y",
        ],
        {},
        2,
        "is not a SQLite or PostgreSQL URL",
    ),
    "perseus bad host": (
        ["-m", "zeus.optimizer.perseus.server.cli", "--host", "256.1.1.1"],
        {},
        2,
        "256.1.1.1",
    ),
    "perseus without its extra": (
        ["-c", PERSEUS_WITHOUT_UVICORN],
        {},
        1,
        "'uvicorn' is not installed",
    ),
    "perseus port": (["-m", "zeus.optimizer.perseus.server.cli", "--port", "0"], {}, 2, "got 0"),
    "perseus bad settings": (
        ["-m", "zeus.optimizer.perseus.server.cli", "--port", "18125"],
        {"PERSEUS_SCHEDULER": "NoSuchScheduler"},
        1,
        "NoSuchScheduler",
    ),
    "monitor energy without NVML": (["-m", "zeus.monitor", "energy"], NO_NVML, 1, "NVML"),
    "monitor bad GPU": (
        ["-m", "zeus.monitor", "power", "--gpu-indices", "7"],
        SIM,
        2,
        "GPU index 7",
    ),
    "monitor bad duration": (
        ["-m", "zeus.monitor", "energy", "--duration", "-1"],
        SIM,
        2,
        "--duration",
    ),
    "monitor stream without a daemon": (
        ["-m", "zeus.monitor", "stream", "/nonexistent/zeusd.sock"],
        {},
        1,
        "Cannot reach zeusd at /nonexistent/zeusd.sock",
    ),
    "monitor stream bad server": (
        ["-m", "zeus.monitor", "stream", "node1:0"],
        {},
        2,
        "SERVER='node1:0'",
    ),
    "device restore without NVML": (["-m", "zeus.device", "restore"], NO_NVML, 1, "NVML"),
    "demo negative seconds": (["-m", "zeus.demo", "--seconds", "-1"], SIM, 2, "--seconds"),
    "demo without NVML": (["-m", "zeus.demo"], NO_NVML, 1, "NVML"),
    "analyze missing file": (
        ["-m", "zeus.analyze", "energy", "/nonexistent.csv"],
        {},
        1,
        "/nonexistent.csv",
    ),
    "simulate missing trace": (
        [
            "-m",
            "zeus.simulate",
            "--trace-dir",
            "/nonexistent",
            "--gpu",
            "v100",
            "--workload",
            "imagenet",
        ],
        {},
        2,
        "/nonexistent",
    ),
}


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_", "CUDA_", "PERSEUS_"))}
    full.update(env)
    return subprocess.run(
        [sys.executable, *args], env=full, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_expected_errors_are_one_line_and_a_hint(case: str):
    args, env, status, needle = CASES[case]
    out = _run(args, env)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == status, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    assert len(lines) == 2, out.stderr
    assert ": error: " in lines[0] and needle in lines[0], lines
    assert ": hint: " in lines[1], lines
    if case == "bso without its extra":
        assert "pip install 'zeus-energy[bso-server]'" in lines[1]
    if case == "perseus without its extra":
        assert "pip install 'zeus-energy[perseus]'" in lines[1]
    if case == "monitor stream without a daemon":
        assert "zeusd runs there" in lines[1]


def test_debug_shows_the_traceback():
    out = _run(["-m", "zeus.monitor", "energy", "--debug"], NO_NVML)
    assert out.returncode != 0 and "Traceback" in out.stderr
    out = _run(["-m", "zeus.monitor", "energy"], {**NO_NVML, "ZEUS_LOG_LEVEL": "debug"})
    assert "Traceback" in out.stderr


def test_help_everywhere():
    for args in (["-m", "zeus"], ["-m", "zeus.analyze", "--help"]):
        out = _run(args, {})
        assert out.returncode == 0 and "zeus" in out.stdout and out.stdout.count("\n") > 3
    out = _run(["-m", "zeus.optimizer.batch_size.server.cli", "--help"], {})
    assert "ZEUS_BSO_DATABASE_URL" in out.stdout and "ZEUS_BSO_TOKEN" in out.stdout
    out = _run(["-m", "zeus.optimizer.perseus.server.cli", "--help"], {})
    assert "PERSEUS_SCHEDULER" in out.stdout and "PERSEUS_DUMP_DIR" in out.stdout


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "module",
    ["zeus.optimizer.batch_size.server.cli", "zeus.optimizer.perseus.server.cli"],
)
def test_servers_start_with_no_settings_and_answer_docs(module: str, tmp_path):
    """No ZEUS_BSO_* or PERSEUS_* variable at all: the defaults serve (the SQLite file and the
    Perseus dump directory land in the working directory)."""
    import time

    import httpx

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_", "PERSEUS_"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--port", str(port)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/docs")
                break
            except httpx.ConnectError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert r.status_code == 200 and "swagger" in r.text.lower()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
