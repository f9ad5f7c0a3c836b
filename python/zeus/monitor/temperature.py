"""`TemperatureMonitor`: GPU temperature over time, as Zeus 0.16 offers it.

The class lives in the Rust extension (`zeus._core.monitor.TemperatureMonitor`): the
process's shared sampler thread (the one that serves `ZeusMonitor`'s energy cache) reads each
GPU's temperature once per `update_period`, so a temperature monitor starts no thread or process
of its own.

Example:
    >>> from zeus.monitor import TemperatureMonitor
    >>> with TemperatureMonitor(gpu_indices=[0], update_period=0.5) as tm:  # doctest: +SKIP
    ...     train_one_epoch()
    ...     timeline = tm.get_temperature_timeline()  # {0: [(t, celsius), ...]}

"""

from __future__ import annotations

from zeus import _core

TemperatureMonitor = _core.monitor.TemperatureMonitor

__all__ = ["TemperatureMonitor"]
