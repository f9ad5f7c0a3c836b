"""Fixtures of the monitor tests: a running `zeus-monitor serve` exporter."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
from childproc import finish, served_address
from local_api import LocalApi

BIN = Path(__file__).resolve().parents[2] / "python" / "zeus" / "_bin" / "zeus-monitor"


def exporter_env(state: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("ZEUS_") and k != "CUDA_VISIBLE_DEVICES"
    }
    env.update(
        ZEUS_GPU_BACKEND="sim",
        ZEUS_SIM_GPUS="H100",
        ZEUS_SIM_LOAD="busy",
        ZEUS_SIM_CPUS="1",
        ZEUS_STATE_DIR=str(state),
    )
    return env


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[str]:
    """A running exporter (the bundled binary, real fidelity); yields its `host:port`."""
    if not BIN.is_file():
        pytest.skip(f"the bundled zeus-monitor is missing at {BIN} (scripts/dev-build)")
    proc = subprocess.Popen(
        [BIN, "serve", "--listen", "127.0.0.1:0"],
        env=exporter_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield served_address(proc)
        proc.terminate()
        _, err = finish(proc, timeout=20)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def api() -> Iterator[LocalApi]:
    """A local server answering as a remote JSON API (`LocalApi.routes`)."""
    server = LocalApi()
    yield server
    server.close()
