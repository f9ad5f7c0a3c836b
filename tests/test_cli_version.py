"""Every console entry point and `python -m` command prints `COMMAND VERSION` for `--version`."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import zeus

PACKAGE_DIR = Path(zeus.__file__).resolve().parent

# `python -m MODULE`, by module, and the command its `--version` names.
MODULES = {
    "zeus": "python -m zeus",
    "zeus.demo": "python -m zeus.demo",
    "zeus.show_env": "python -m zeus.show_env",
    "zeus.monitor": "python -m zeus.monitor",
    "zeus.analyze": "python -m zeus.analyze",
    "zeus.device": "python -m zeus.device",
    "zeus.device.sim": "python -m zeus.device.sim",
    "zeus.optimizer.recurring.simulate": "python -m zeus.simulate",
    "zeus.optimizer.batch_size.server": "zeus-bso-server",
    "zeus.optimizer.batch_size.server.cli": "zeus-bso-server",
    "zeus.optimizer.perseus.server.cli": "zeus-perseus-server",
}
# The reference's module names, which run the same `__main__` (`zeus._aliases`).
ALIASES = {
    "zeus.simulate": "python -m zeus.simulate",
    "zeus.sim": "python -m zeus.device.sim",
}
CONSOLE_SCRIPTS = ["zeus-monitor", "zeusd", "zeus-bso-server", "zeus-perseus-server"]


def _runnable_modules() -> set[str]:
    """Modules of the installed package that `python -m` runs: packages with a `__main__.py`,
    and modules with an `if __name__ == "__main__":` block."""
    found = set()
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            found.add(".".join(parts[:-1]))
        elif re.search(r'^if __name__ == "__main__":', path.read_text(), re.M):
            found.add(".".join(parts))
    return found


def _entry_points() -> dict[str, str]:
    dist = importlib.metadata.distribution("zeus-energy")
    return {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}


def test_every_runnable_module_has_a_case() -> None:
    assert _runnable_modules() == set(MODULES)


def test_every_console_script_has_a_case() -> None:
    assert set(_entry_points()) == set(CONSOLE_SCRIPTS)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_", "ZEUSD_"))}
    # `--version` opens no GPU: any attempt would fail on this library path.
    env["ZEUS_NVML_LIB"] = "/nonexistent/libnvidia-ml.so.1"
    return env


def _check(argv: list[str], command: str) -> None:
    proc = subprocess.run(
        [*argv, "--version"], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{command} {zeus.__version__}\n", proc.stdout + proc.stderr


@pytest.mark.parametrize("module", sorted({**MODULES, **ALIASES}))
def test_python_m_version(module: str) -> None:
    _check([sys.executable, "-m", module], {**MODULES, **ALIASES}[module])


@pytest.mark.parametrize("script", CONSOLE_SCRIPTS)
def test_console_script_version(script: str) -> None:
    installed = Path(sys.executable).parent / script
    if installed.is_file():
        argv = [str(installed)]
    else:  # installed elsewhere on the path, or not at all: load the entry point as pip would
        module, func = _entry_points()[script].split(":")
        loader = f"import sys; sys.argv[0] = {script!r}; from {module} import {func} as f; "
        argv = [sys.executable, "-c", loader + "sys.exit(f())"]
    _check(argv, script)


def test_subcommands_leave_version_to_their_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "zeus.device.sim", "presets", "--version"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "unrecognized arguments: --version" in proc.stderr, proc.stderr
