"""The SoC exception, at Zeus 0.16's path (`zeus.device.soc.common.ZeusSoCInitError`)."""

from __future__ import annotations

from zeus.device.exception import ZeusBaseSoCError

__all__ = ["ZeusSoCInitError"]


class ZeusSoCInitError(ZeusBaseSoCError):
    """No SoC (Apple Silicon, NVIDIA Jetson) can be monitored on this machine."""
