"""`zeus.util.cli.describe`: expected errors become one line and a hint."""

from __future__ import annotations

import pytest
from zeus.device.exception import (
    ZeusdConnectionError,
    ZeusdSettingHeldError,
    ZeusGPULibraryNotFoundError,
    ZeusGPUNoPermissionError,
)
from zeus.exception import ZeusBaseError
from zeus.util.cli import describe


@pytest.mark.parametrize(
    ("error", "message", "hint"),
    [
        (
            ZeusGPULibraryNotFoundError("libnvidia-ml.so.1: cannot open shared object file"),
            "NVML (libnvidia-ml.so.1) could not be loaded: no NVIDIA GPU can be used",
            "ZEUS_GPU_BACKEND=sim",
        ),
        (
            ZeusdConnectionError("zeusd at /run/zeusd.sock does\n  not answer"),
            "zeusd at /run/zeusd.sock does not answer",
            "systemctl status zeusd",
        ),
        # The GPU errors without a hint of their own take their base class's.
        (
            ZeusGPUNoPermissionError("GPU 0: Insufficient Permissions"),
            "GPU 0: Insufficient Permissions",
            "python -m zeus.show_env",
        ),
        (
            ZeusdSettingHeldError("GPU 0's power limit is held by another running client"),
            "GPU 0's power limit is held by another running client",
            "python -m zeus.show_env",
        ),
    ],
)
def test_gpu_errors_carry_their_own_line_and_hint(
    error: ZeusBaseError, message: str, hint: str
) -> None:
    described = describe(error)
    assert described is not None
    assert described.message == message
    assert hint in described.hint, described.hint


def test_a_zeus_error_without_a_hint_is_not_described_as_expected() -> None:
    assert describe(ZeusBaseError("something unforeseen")) is None
