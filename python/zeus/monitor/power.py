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

from zeus import _core

PowerMonitor = _core.monitor.PowerMonitor
infer_counter_update_period = _core.monitor.infer_counter_update_period

__all__ = ["PowerMonitor", "infer_counter_update_period"]
