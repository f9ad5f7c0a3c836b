"""Monolithic SoCs (Apple Silicon, NVIDIA Jetson): Zeus 0.16's `get_soc`, unsupported here.

Zeus 0.16 measures the energy of an Apple Silicon or Jetson SoC and raises
`ZeusSoCInitError` where it finds neither. This build has no SoC backend, so `get_soc()`
always raises it, with a message that says so; code that tries it and falls back (as Zeus 0.16
code does) keeps working.
"""

from __future__ import annotations

import platform
from typing import NoReturn

from zeus.device.soc.common import ZeusSoCInitError

__all__ = ["ZeusSoCInitError", "get_soc"]


def get_soc() -> NoReturn:
    """Zeus 0.16's SoC object; here there is never one.

    Raises:
        ZeusSoCInitError: always: this build of zeus measures no SoC (Zeus 0.16 raises it on
            machines without an Apple Silicon or Jetson SoC).

    """
    raise ZeusSoCInitError(
        f"No observable SoC was found on the current machine ({platform.machine()}, "
        f"{platform.system()}): this build of zeus has no SoC support (Zeus 0.16's Apple "
        "Silicon and NVIDIA Jetson backends); measure GPUs with ZeusMonitor(gpu_indices=...) "
        "and CPUs with ZeusMonitor(cpu_indices=...)"
    )
