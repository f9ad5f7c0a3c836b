"""`PowerMonitor`: GPU power sampled by a Rust thread into a bounded in-memory timeline.

The class lives in the Rust extension (`zeus._core.monitor.PowerMonitor`); this module
re-exports it.
Unlike the reference, sampling runs on a thread (no subprocess, no temporary CSV file), the
default period is really half the driver's power update period (the reference's inference always
returned 0, i.e. busy polling), and the timeline keeps at most `max_samples` samples.

Timestamps are the GPU backend's clock (`zeus.device.get_gpus().now()`, which is `time.time()`
except on the simulator's virtual clock, where sampling is manual: advance the clock, then call
`sample_now()`).

Example:
    >>> from zeus.device import get_gpus
    >>> from zeus.monitor import PowerMonitor
    >>> gpus = get_gpus()  # doctest: +SKIP
    >>> with PowerMonitor(gpu_indices=[0]) as pm:  # doctest: +SKIP
    ...     start = gpus.now()
    ...     train_one_epoch()
    ...     joules = pm.get_energy(start, gpus.now())  # {0: J}

"""

from __future__ import annotations

from enum import Enum

from zeus import _core

PowerMonitor = _core.monitor.PowerMonitor
infer_counter_update_period = _core.monitor.infer_counter_update_period

__all__ = ["PowerDomain", "PowerMonitor", "infer_counter_update_period"]


class PowerDomain(str, Enum):
    """Power readings a `PowerMonitor` samples (Zeus 0.16's enum).

    A member is also its string, so either spelling works wherever a power domain is taken:
    `PowerMonitor(power_domains=[PowerDomain.DEVICE_INSTANT])` is
    `PowerMonitor(power_domains=["device_instant"])`. `MEMORY_AVERAGE` is Zeus 0.16's member;
    this build does not read it, and a monitor asked for it raises `ValueError`.
    """

    DEVICE_INSTANT = "device_instant"
    DEVICE_AVERAGE = "device_average"
    MEMORY_AVERAGE = "memory_average"

    def __str__(self) -> str:
        return self.value
