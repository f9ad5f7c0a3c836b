"""`python -m zeus.show_env`: what zeus sees on this machine (Zeus 0.16's command).

Prints the Python and package versions, the GPU backend, the library it reads the GPUs through
and its devices with their vendor (or why there are none), what opening them noted (energy
counters disabled by the start check, say), and the settings in force (`ZEUS_*`, `CUDA_*`, and
ROCm's `HIP_*`, `ROCR_*`, `ROCM_PATH`, `AMDSMI_LIB_DIR`), so a bug report can include them.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sys
import warnings
from urllib.parse import urlsplit, urlunsplit

from zeus.util import cli

_PACKAGES = (
    "zeus-energy",
    "torch",
    "transformers",
    "nvidia-ml-py",
    "amdsmi",
    "pydantic",
    "numpy",
)

# Settings that decide which GPUs zeus sees and through which library.
_SETTING_PREFIXES = ("ZEUS_", "CUDA_", "HIP_", "ROCR_")
_SETTING_NAMES = ("ROCM_PATH", "AMDSMI_LIB_DIR")

# The vendor library each backend reads its GPUs through: (what it is called, its file's stem).
_BACKEND_LIBRARY = {
    "amd": ("AMD SMI", "libamd_smi.so"),
    "nvml": ("NVML", "libnvidia-ml.so"),
}


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


def _loaded_file(stem: str) -> str | None:
    """Path of the shared library this process mapped whose file name starts with `stem`.

    Read from `/proc/self/maps`, so it is the file the loader resolved (symlinks followed),
    whichever way it was found; None where that is unavailable (not Linux) or none is mapped.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith(stem):
                    return fields[5].strip()
    except OSError:
        pass
    return None


def show_env() -> None:
    """Print the environment report to stdout."""
    print(f"Python: {sys.version.split()[0]} ({platform.platform()})")
    for p in _PACKAGES:
        print(f"{p}: {_version(p)}")
    settings = {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(_SETTING_PREFIXES) or k in _SETTING_NAMES
    }
    for k, v in settings.items():
        print(f"{k}={redact(k, v)}")
    from zeus.device import get_gpus
    from zeus.device.exception import ZeusBaseGPUError

    # Opening the GPUs warns with each of its notes; they are printed below with the rest of
    # the report instead of twice.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            gpus = get_gpus()
        except ZeusBaseGPUError as e:
            print(f"GPUs: none available ({e})")
            return
    print(f"GPU backend: {gpus.backend} ({len(gpus)} visible)")
    if gpus.backend in _BACKEND_LIBRARY:
        library, stem = _BACKEND_LIBRARY[gpus.backend]
        print(f"GPU library: {library} ({_loaded_file(stem) or stem})")
    for i in range(len(gpus)):
        energy = "energy counter" if gpus.supports_get_total_energy_consumption(i) else "no counter"
        lo, hi = gpus.get_power_management_limit_constraints(i)
        print(
            f"  GPU {i}: {gpus.get_name(i)}, {gpus.get_architecture(i)}, "
            f"vendor {gpus.get_vendor(i)}, "
            f"power limit {gpus.get_power_management_limit(i) // 1000} W "
            f"(range {lo // 1000}-{hi // 1000} W), {energy}"
        )
    notes = list(gpus.notes)
    notes += [str(w.message) for w in caught if str(w.message) not in notes]
    if notes:
        print("GPU notes:")
        for note in notes:
            print(f"  {note}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m zeus.show_env`; returns the exit status."""
    return cli.run("python -m zeus.show_env", _main, argv)


def _main(argv: list[str]) -> int:
    cli.Parser(
        prog="python -m zeus.show_env",
        description="Print the Python and package versions, the GPU backend, its library and "
        "its devices, what opening them noted, and the ZEUS_*, CUDA_*, HIP_*, ROCR_*, ROCM_PATH "
        "and AMDSMI_LIB_DIR settings in force (credentials redacted), for bug reports.",
    ).parse_args(argv)
    show_env()
    return 0


if __name__ == "__main__":
    sys.exit(main())
