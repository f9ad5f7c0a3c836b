"""`PowerMonitor`: GPU power sampled by a Rust thread into a bounded in-memory timeline.

The class lives in the Rust extension (`zeus._core.PowerMonitor`); this module re-exports it.
Unlike the reference, sampling runs on a thread (no subprocess, no temporary CSV file), the
default period is really half the driver's power update period (the reference's inference always
returned 0, i.e. busy polling), and the timeline keeps at most `max_samples` samples.

Example:
    >>> from zeus.monitor import PowerMonitor
    >>> with PowerMonitor(gpu_indices=[0]) as pm:
    ...     start = pm.gpus_now()  # doctest: +SKIP

"""

from __future__ import annotations

from zeus import _core

PowerMonitor = _core.PowerMonitor

__all__ = ["PowerMonitor"]
