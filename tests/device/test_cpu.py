"""CPU packages through RAPL: discovery on static trees, errors, and the simulated CPUs.

RAPL configuration is read once per process (the zones are process-wide), so every check runs
in a fresh interpreter with its own environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
from childproc import python_child

PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"


def run_child(
    code: str, env: dict[str, str], timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with `env` added (and no inherited RAPL settings)."""
    full = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ZEUS_SIM_CPUS", "ZEUS_RAPL", "ZEUS_SIM_RAPL"))
    }
    full["PYTHONPATH"] = os.pathsep.join([str(PYTHON_DIR), full.get("PYTHONPATH", "")])
    full.update(env)
    return python_child(code, full, timeout)


def make_zone(path: Path, name: str, energy: int, max_uj: int = 1 << 32) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "name").write_text(f"{name}\n")
    (path / "energy_uj").write_text(f"{energy}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")


@pytest.fixture
def world_readable_tmp() -> Iterator[Path]:
    """A temporary directory that uid 65534 can traverse (pytest's own is root-only)."""
    d = Path(tempfile.mkdtemp(prefix="zeus-rapl-test-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_static_tree_gives_packages_and_dram(tmp_path: Path) -> None:
    make_zone(tmp_path / "intel-rapl:0", "package-0", 1_500_000)
    make_zone(tmp_path / "intel-rapl:0" / "intel-rapl:0:0", "core", 7)
    make_zone(tmp_path / "intel-rapl:0" / "intel-rapl:0:1", "dram", 250_000)
    make_zone(tmp_path / "intel-rapl:1", "package-1", 3_000)
    out = run_child(
        """
        import json
        from zeus.device import get_cpus
        c = get_cpus()
        m0, m1 = c.get_total_energy_consumption(0), c.getTotalEnergyConsumption(1)
        dram = [c.supportsGetDramEnergyConsumption(i) for i in (0, 1)]
        print(json.dumps([len(c), m0.cpu_mj, m0.dram_mj, m1.cpu_mj, m1.dram_mj, *dram,
                          c.backend]))
        """,
        {"ZEUS_RAPL_ROOT": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [2, 1500.0, 250.0, 3.0, None, True, False, "RAPL"]


def test_no_rapl_says_where_it_looked(tmp_path: Path) -> None:
    out = run_child(
        """
        from zeus.device.cpu import get_cpus, ZeusRAPLNotSupportedError
        from zeus.device.exception import ZeusBaseCPUError
        try:
            get_cpus()
        except ZeusRAPLNotSupportedError as e:
            assert isinstance(e, ZeusBaseCPUError)
            print(e.message)
        """,
        {"ZEUS_RAPL_ROOT": str(tmp_path / "nothing")},
    )
    assert out.returncode == 0, out.stderr
    assert str(tmp_path / "nothing") in out.stdout
    assert "containers" in out.stdout


def test_unreadable_energy_file_names_the_file_and_the_fixes(world_readable_tmp: Path) -> None:
    """Acceptance: an unreadable `energy_uj` is an error naming it and the fixes, never a zero.

    Root reads any file whatever its mode, so the check drops to uid 65534 (after the
    interpreter has loaded zeus, since Python itself lives where that user cannot read).
    """
    pkg = world_readable_tmp / "intel-rapl:0"
    make_zone(pkg, "package-0", 123)
    for p in (pkg, pkg / "name", pkg / "max_energy_range_uj"):
        p.chmod(0o755 if p.is_dir() else 0o444)
    energy = pkg / "energy_uj"
    energy.chmod(0o400)
    code = """
        import os
        from zeus.device.cpu import get_cpus, ZeusRAPLPermissionError, ZeusCPUNoPermissionError
        if os.getuid() == 0:
            os.setgid(65534)
            os.setuid(65534)
        try:
            get_cpus()
        except ZeusRAPLPermissionError as e:
            assert isinstance(e, ZeusCPUNoPermissionError)
            print(e.message)
        else:
            print("NO ERROR")
        """
    out = run_child(
        code,
        {"ZEUS_RAPL_ROOT": str(world_readable_tmp)},
    )
    assert out.returncode == 0, out.stderr
    msg = out.stdout
    assert str(energy) in msg
    for fix in ("root", "chmod a+r", "udev", "ZEUS_RAPL_ROOT"):
        assert fix in msg, msg


def test_simulated_cpus_are_opt_in_and_match_their_truth() -> None:
    out = run_child(
        """
        import json, time
        import zeus.device.sim as sim
        from zeus.device import get_cpus
        c = get_cpus()
        root, range_uj = sim.rapl_tree()
        lo0 = sim.cpu_published_energy(1)
        e0, hi0 = c.get_total_energy_consumption(1), sim.cpu_true_energy(1)
        time.sleep(1.0)
        lo1 = sim.cpu_published_energy(1)
        e1, hi1 = c.get_total_energy_consumption(1), sim.cpu_true_energy(1)
        print(json.dumps({"n": len(c), "backend": c.backend, "root": str(root), "range": range_uj,
                          "got": [(e1.cpu_mj - e0.cpu_mj) / 1e3, (e1.dram_mj - e0.dram_mj) / 1e3],
                          "lo": [lo1[0] - hi0[0], lo1[1] - hi0[1]],
                          "hi": [hi1[0] - lo0[0], hi1[1] - lo0[1]],
                          "power": sim.cpu_true_power(0)}))
        """,
        {"ZEUS_SIM_CPUS": "2"},
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["n"] == 2 and r["backend"] == "Simulated RAPL"
    assert r["range"] == 262143328850
    assert not Path(r["root"]).exists(), "the simulator's temporary tree is removed at exit"
    # Each read lies between what the simulator's writer thread had published before it (the
    # thread may lag on a loaded machine) and the truth after it; the files hold whole mJ.
    for got, lo, hi in zip(r["got"], r["lo"], r["hi"]):
        assert lo - 2e-3 <= got <= hi + 2e-3, r
    assert 60 <= r["power"][0] <= 120 and 5 <= r["power"][1] <= 15


def test_simulated_cpus_need_the_opt_in() -> None:
    out = run_child(
        """
        import zeus.device.sim as sim
        try:
            sim.cpu_count()
        except RuntimeError as e:
            print(e)
        """,
        {"ZEUS_RAPL_ROOT": "/nonexistent"},
    )
    assert "ZEUS_SIM_CPUS" in out.stdout, out.stderr
