"""Pydantic models of the power-limit optimizer: its states and its measurements."""

from __future__ import annotations

from pydantic import BaseModel, PositiveFloat, PositiveInt

__all__ = ["Ready", "Warmup", "Profiling", "Done", "PowerLimitMeasurement"]


class Ready(BaseModel):
    """Waiting `steps` more steps before setting `next_power_limit` (mW) and warming up."""

    next_power_limit: PositiveInt
    steps: PositiveInt


class Warmup(BaseModel):
    """Running `steps` more steps at `current_power_limit` (mW) before measuring."""

    current_power_limit: PositiveInt
    steps: PositiveInt


class Profiling(BaseModel):
    """Measuring `steps` more steps at `current_power_limit` (mW)."""

    current_power_limit: PositiveInt
    steps: PositiveInt


class Done(BaseModel):
    """Profiling is over; training runs at `optimal_power_limit` (mW)."""

    optimal_power_limit: PositiveInt


class PowerLimitMeasurement(BaseModel):
    """What profiling one power limit measured.

    Attributes:
        power_limit: Watts.
        energy: Joules, summed over all GPUs (and all ranks under torch.distributed).
        time: Seconds.

    """

    power_limit: PositiveInt
    energy: PositiveFloat
    time: PositiveFloat


class _PowerLimitMeasurementList(BaseModel):
    """The profile file: `{"measurements": [{"power_limit": W, "energy": J, "time": s}, ...]}`."""

    measurements: list[PowerLimitMeasurement]
