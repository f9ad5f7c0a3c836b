"""`python -m zeus.show_env`: what zeus sees on this machine (Zeus 0.16's command).

Prints the Python and package versions, the GPU backend and its devices (or why there are
none), and the simulator settings in force, so a bug report can include them.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sys
from urllib.parse import urlsplit, urlunsplit

from zeus.util import cli

_PACKAGES = ("zeus-energy", "torch", "transformers", "nvidia-ml-py", "pydantic", "numpy")


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# Settings whose value is a credential: tokens, keys, secrets, passwords.
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def redact(name: str, value: str) -> str:
    """The value of setting `name` as a bug report may show it.

    Credentials are replaced, and the password of a URL (`postgresql://user:pw@host/db`) is
    masked; the rest is kept.
    """
    if _SECRET_NAME.search(name):
        return "<redacted>" if value else value
    try:
        parts = urlsplit(value)
    except ValueError:
        return value
    if parts.scheme and parts.password is not None:
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        netloc = f"{parts.username or ''}:***@{host}"
        return urlunsplit(parts._replace(netloc=netloc))
    return value


def show_env() -> None:
    """Print the environment report to stdout."""
    print(f"Python: {sys.version.split()[0]} ({platform.platform()})")
    for p in _PACKAGES:
        print(f"{p}: {_version(p)}")
    settings = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("ZEUS_", "CUDA_"))}
    for k, v in settings.items():
        print(f"{k}={redact(k, v)}")
    from zeus.device import get_gpus
    from zeus.device.exception import ZeusBaseGPUError

    try:
        gpus = get_gpus()
    except ZeusBaseGPUError as e:
        print(f"GPUs: none available ({e})")
        return
    print(f"GPU backend: {gpus.backend} ({len(gpus)} visible)")
    for i in range(len(gpus)):
        energy = "energy counter" if gpus.supports_get_total_energy_consumption(i) else "no counter"
        lo, hi = gpus.get_power_management_limit_constraints(i)
        print(
            f"  GPU {i}: {gpus.get_name(i)}, {gpus.get_architecture(i)}, "
            f"power limit {gpus.get_power_management_limit(i) // 1000} W "
            f"(range {lo // 1000}-{hi // 1000} W), {energy}"
        )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m zeus.show_env`; returns the exit status."""
    return cli.run("python -m zeus.show_env", _main, argv)


def _main(argv: list[str]) -> int:
    cli.Parser(
        prog="python -m zeus.show_env",
        description="Print the Python and package versions, the GPU backend and its devices, "
        "and the ZEUS_* and CUDA_* settings in force (credentials redacted), for bug reports.",
    ).parse_args(argv)
    show_env()
    return 0


if __name__ == "__main__":
    sys.exit(main())
