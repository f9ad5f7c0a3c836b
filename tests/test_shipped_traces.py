"""The Zeus traces ship inside the package, and what needs them runs without `../shared`.

The three published CSV files live in `zeus/optimizer/recurring/simulate/traces/`
(`zeus.simulate.TRACE_DIR`) with their license and attribution. The commands that need traces
(the README's reproduction, `python -m zeus.simulate`, the demos) are run here in a fresh
interpreter, from a temporary directory, with every Python-level read of the shared data
directory refused (an audit hook), so they must find the shipped copy.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import zeus
from zeus.simulate import TRACE_DIR, simulate

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
CSVS = ("summary_train.csv", "summary_power_a40.csv", "summary_power_v100.csv")

# Runs a script (`RUNNER BLOCKED script.py args...`) or a module (`... -m module args...`)
# with every open or directory listing under BLOCKED refused.
RUNNER = """
import os, runpy, sys

blocked = os.path.realpath(sys.argv[1])


def refuse_blocked(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args:
        path = args[0]
        if isinstance(path, (str, bytes, os.PathLike)):
            real = os.path.realpath(os.fsdecode(path))
            if real == blocked or real.startswith(blocked + os.sep):
                raise PermissionError(f"{real}: the shared data directory is unavailable")


sys.addaudithook(refuse_blocked)
if sys.argv[2] == "-m":
    sys.argv = [sys.argv[3], *sys.argv[4:]]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_without_shared(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `args` (a script and its arguments, or `-m module ...`) unable to read `../shared`."""
    runner = cwd / "without_shared.py"
    runner.write_text(RUNNER)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_", "CUDA_"))}
    pkg_root = str(Path(zeus.__file__).resolve().parents[1])
    full.update(PYTHONPATH=os.pathsep.join(filter(None, [pkg_root, full.get("PYTHONPATH")])))
    full.update(env)
    return subprocess.run(
        [sys.executable, str(runner), str(SHARED), *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_the_traces_ship_with_their_license_and_attribution():
    assert TRACE_DIR.is_dir()
    assert TRACE_DIR.resolve().is_relative_to(Path(zeus.__file__).resolve().parent)
    assert sorted(p.name for p in TRACE_DIR.iterdir()) == sorted(
        [*CSVS, "LICENSE", "NOTICE", "README.md"]
    )
    license_text = (TRACE_DIR / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in license_text
    notice = (TRACE_DIR / "NOTICE").read_text()
    assert "https://github.com/ml-energy/zeus" in notice and "Apache License" in notice
    readme = (TRACE_DIR / "README.md").read_text()
    assert "https://github.com/ml-energy/zeus" in readme and "Apache License 2.0" in readme
    assert all(name in readme for name in CSVS)


def test_the_shipped_traces_are_the_published_ones(shared_data: Path):
    for name in CSVS:
        published = shared_data / "zeus-traces" / name
        assert (TRACE_DIR / name).read_bytes() == published.read_bytes(), name


def test_simulate_reads_the_shipped_traces_unless_told_otherwise(shared_data: Path, tmp_path: Path):
    shipped = simulate(None, "v100", "squad", seed=3)
    published = simulate(shared_data / "zeus-traces", "v100", "squad", seed=3)
    assert shipped == published
    # A directory given is the one read: no quiet fall-back to the shipped copy.
    with pytest.raises(ValueError, match="no power trace .*no-such-traces"):
        simulate(tmp_path / "no-such-traces", "v100", "squad", seed=3)


def test_the_guard_refuses_the_shared_data(shared_data: Path, tmp_path: Path):
    """The check below is real: a script that reads `../shared` fails under it."""
    script = tmp_path / "reads_shared.py"
    script.write_text(f"open({str(shared_data / 'zeus-traces' / CSVS[0])!r}).read()\n")
    out = run_without_shared([str(script)], tmp_path)
    assert out.returncode != 0 and "the shared data directory is unavailable" in out.stderr


def readme_trace_command() -> str:
    """The one command of the README's trace reproduction ("Second example")."""
    text = (REPO / "README.md").read_text()
    section = text.split("### Second example", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "the README's trace reproduction has no bash block"
    [command] = [ln for ln in block.group(1).splitlines() if ln.strip()]
    return command


def test_the_readme_trace_reproduction_runs_without_shared(tmp_path: Path):
    command = shlex.split(readme_trace_command())
    assert command[:2] == ["python", "examples/trace_driven/run_all.py"], command
    assert not any("shared" in arg for arg in command), command
    script = tmp_path / "run_all.py"
    shutil.copy(REPO / command[1], script)
    out = run_without_shared([str(script), *command[2:]], tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [ln.split() for ln in out.stdout.splitlines()[2:] if ln.strip()]
    from zeus.simulate import WORKLOADS

    assert [(r[0], r[1]) for r in rows] == [(g, w) for g in ("a40", "v100") for w in WORKLOADS]
    # Zeus saves energy on every workload and GPU of the paper.
    assert all(float(r[5].rstrip("%")) > 5 for r in rows), out.stdout


def test_simulate_command_defaults_to_the_shipped_traces(tmp_path: Path):
    args = ["-m", "zeus.simulate", "--gpu", "a40", "--workload", "imagenet", "--seed", "2"]
    out = run_without_shared(args, tmp_path)
    assert out.returncode == 0, out.stderr
    expected, _ = simulate(None, "a40", "imagenet", seed=2)
    assert json.loads(out.stdout) == expected.to_dict()
    help_text = subprocess.run(
        [sys.executable, "-m", "zeus.simulate", "--help"], capture_output=True, text=True
    ).stdout
    assert "default: the Zeus traces shipped with zeus" in " ".join(help_text.split())


def test_the_demos_run_without_shared(tmp_path: Path):
    out = run_without_shared(
        ["-m", "zeus.demo", "--seconds", "1", "--plot", str(tmp_path / "demo.png")],
        tmp_path,
        ZEUS_GPU_BACKEND="sim",
        ZEUS_SIM_GPUS="A40,V100",
        ZEUS_STATE_DIR=str(tmp_path / "state"),
    )
    assert out.returncode == 0, out.stderr
    assert "chosen:" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    # Its power plot, drawn by zeus.analyze: a 900x450 PNG.
    png = (tmp_path / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (900, 450)
    script = tmp_path / "power_limit_demo.py"
    shutil.copy(REPO / "examples" / "power_limit_demo.py", script)
    out = run_without_shared([str(script)], tmp_path, ZEUS_STATE_DIR=str(tmp_path / "state2"))
    assert out.returncode == 0, out.stderr
    shipped = TRACE_DIR / "summary_power_a40.csv"
    assert f"workload: ImageNet/ResNet-50 (batch 256) from {shipped}" in out.stdout
    assert re.search(r"chosen power limit: \d+ W", out.stdout), out.stdout
