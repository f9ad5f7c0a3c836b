"""Which CPU package (socket) a process runs on: Zeus 0.16's `get_current_cpu_index`.

Linux only: the logical CPU a process last ran on is field 39 (`processor`) of
`/proc/<pid>/stat`, and that CPU's package is
`/sys/devices/system/cpu/cpu<N>/topology/physical_package_id`, the package index RAPL's
`intel-rapl:<i>` zones (and so `ZeusMonitor(cpu_indices=...)`) count by.
"""

from __future__ import annotations

import os
from typing import Literal, Union

from zeus.device.cpu.exception import ZeusCPUInitError

__all__ = ["get_current_cpu_index"]

# Field 39 of /proc/<pid>/stat, counted from field 3 (the first after the `(comm)` field,
# which may itself hold spaces and parentheses).
_PROCESSOR_FIELD = 39 - 3


def get_current_cpu_index(pid: Union[int, Literal["current"]] = "current") -> int:
    """The CPU package (socket) index process `pid` is running on.

    The scheduler may move a process to another package at any time; pin it (`taskset`, or
    `os.sched_setaffinity`) for the answer to hold while you measure.

    Args:
        pid: A process id, or `"current"` for this process.

    Returns:
        The package index (`physical_package_id`) of the logical CPU the process last ran on.

    Raises:
        ValueError: `pid` is neither a positive int nor `"current"`, or no such process runs.
        ZeusCPUInitError: the machine does not say (no Linux `/proc` or CPU topology in
            `/sys`); the message names the file.

    """
    if pid == "current":
        stat_path = "/proc/self/stat"
    elif isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
        stat_path = f"/proc/{pid}/stat"
    else:
        raise ValueError(f"pid={pid!r}: expected a process id (an int > 0) or 'current'")
    try:
        with open(stat_path) as f:
            stat = f.read()
    except FileNotFoundError:
        if pid != "current" and os.path.isdir("/proc/self"):
            raise ValueError(f"pid={pid!r}: no such process") from None
        raise ZeusCPUInitError(
            f"Cannot tell which CPU runs the process: {stat_path} does not exist (Linux only)"
        ) from None
    fields = stat.rpartition(")")[2].split()
    try:
        cpu = int(fields[_PROCESSOR_FIELD])
    except (IndexError, ValueError) as e:
        raise ZeusCPUInitError(f"{stat_path} has no processor field: {stat!r}") from e
    topology = f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id"
    try:
        with open(topology) as f:
            return int(f.read().strip())
    except (OSError, ValueError) as e:
        raise ZeusCPUInitError(
            f"Cannot read the package of CPU {cpu} from {topology}: {type(e).__name__}: {e}"
        ) from e
