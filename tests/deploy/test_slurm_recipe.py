"""The Slurm prolog/epilog recipe (examples/slurm) against a real `zeus-monitor serve` on
simulated busy GPUs: a job's record names only its GPUs and their energy over the job."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from childproc import served_address

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "slurm"
BIN = REPO / "python" / "zeus" / "_bin" / "zeus-monitor"


def _energies(base: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for m in re.finditer(
        r'^zeus_gpu_energy_joules_total\{[^}]*gpu="(\d+)"[^}]*\} (\S+)$', text, re.M
    ):
        out[m.group(1)] = float(m.group(2))
    return out


@pytest.mark.skipif(shutil.which("curl") is None, reason="the recipe reads the exporter with curl")
def test_prolog_and_epilog_record_the_jobs_gpu_energy(tmp_path: Path) -> None:
    exporter = shutil.which("zeus-monitor") or str(BIN)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ZEUS_")},
        "ZEUS_GPU_BACKEND": "sim",
        "ZEUS_SIM_GPUS": "H100,H100,H100",
        "ZEUS_SIM_LOAD": "busy",
        "ZEUS_STATE_DIR": str(tmp_path / "state"),
    }
    proc = subprocess.Popen(
        [exporter, "serve", "--listen", "127.0.0.1:0", "--cpus", "none"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://{served_address(proc)}"
        deadline = time.monotonic() + 20
        while len(_energies(base)) < 3:
            assert time.monotonic() < deadline, "no energy from the exporter"
            time.sleep(0.05)
        job_env = {
            **os.environ,
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_GPUS": "0,2",
            "ZEUS_EXPORTER": base,
            "ZEUS_JOB_DIR": str(tmp_path / "jobs"),
            "ZEUS_JOB_LOG": str(tmp_path / "log" / "jobs.jsonl"),
        }
        before = _energies(base)
        subprocess.run([str(RECIPE / "zeus-energy-prolog.sh")], env=job_env, check=True, timeout=30)
        # The job runs until the GPUs have drawn a good kilojoule each since the prolog
        # returned (on a busy machine the prolog's own read may come a second after `before`).
        started = _energies(base)
        deadline = time.monotonic() + 30
        while _energies(base)["0"] < started["0"] + 1000:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        subprocess.run([str(RECIPE / "zeus-energy-epilog.sh")], env=job_env, check=True, timeout=30)
        after = _energies(base)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    record = json.loads((tmp_path / "log" / "jobs.jsonl").read_text().strip())
    assert record["job"] == "4242"
    assert set(record["gpu_energy_j"]) == {"0", "2"}, record
    for g in ("0", "2"):
        # Between the exporter's values just around the prolog and the epilog.
        assert 0 < record["gpu_energy_j"][g] <= after[g] - before[g], record
        assert record["gpu_energy_j"][g] >= 1000 * 0.9, record
    assert record["total_gpu_energy_j"] == pytest.approx(
        sum(record["gpu_energy_j"].values()), abs=0.01
    )
    assert not (tmp_path / "jobs" / "4242.start").exists(), "the start record is cleaned up"
