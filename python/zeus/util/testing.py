"""Test helpers: `ReplayZeusMonitor`, which replays a `ZeusMonitor` log.

Code driven by energy measurements (such as the power-limit optimizer) can then be tested
against measured data without a GPU.
"""

from __future__ import annotations

import csv
import os
import re
import warnings
from typing import Any, Iterator, Sequence

__all__ = ["ReplayZeusMonitor"]

# `gpu0_energy`, `cpu0_energy`, `dram0_energy`, and each with `_uncertainty` (its bound).
_COLUMN = re.compile(r"^(gpu|cpu|dram)(\d+)_energy(_uncertainty)?$")


class _FallbackMeasurement:
    """Stands in for `zeus.monitor.Measurement` where the extension is not built in."""

    def __init__(self, time: float, energy: dict[int, float]) -> None:
        self.time = time
        self.energy = energy

    @property
    def total_energy(self) -> float:
        return sum(self.energy.values())

    def __repr__(self) -> str:
        return f"Measurement(time={self.time!r}, energy={self.energy!r})"


def _measurement(time: float, energy: dict[int, float], **extra: Any) -> Any:
    # `zeus.monitor.Measurement` is the binding's class: taken from the binding, so that this
    # module (below zeus.monitor, which uses zeus.util) does not import a layer above it.
    try:
        from zeus import _core
    except ImportError:
        return _FallbackMeasurement(time, energy)
    return _core.monitor.Measurement(time=time, energy=energy, **extra)


class ReplayZeusMonitor:
    """A `ZeusMonitor` look-alike whose measurements come from a `ZeusMonitor` log file.

    The log is a CSV with the header `start_time,window_name,elapsed_time,` and then energy
    columns: `gpu<i>_energy` (Zeus 0.16 writes only these), `cpu<i>_energy` and
    `dram<i>_energy` (what this package's `ZeusMonitor(cpu_indices=...)` adds; a CPU-only
    monitor writes no GPU column), and each one's `..._uncertainty` bound. Each `end_window`
    call returns the next line's elapsed time and energies (with their bounds), in file order;
    a cancelled window returns zeros and consumes no line.

    Attributes:
        gpu_indices: GPU indices, from the header's `gpu<i>_energy` columns (`[]` for a
            CPU-only log).
        nvml_gpu_indices: The same (there is no device behind a replay).
        cpu_indices: CPU package indices, from the `cpu<i>_energy` columns, or None when the
            log has none (as `ZeusMonitor.cpu_indices`).
        ignore_sync_execution: See the argument (`ignore_sync_cuda` is the same value).
        approx_instant_energy: See the argument.

    """

    def __init__(
        self,
        gpu_indices: Sequence[int] | None = None,
        monitor_exec: Any = "zeus_monitor",
        log_file: str | os.PathLike[str] | None = None,
        ignore_sync_cuda: bool | None = None,
        match_window_name: bool = True,
        *,
        ignore_sync_execution: bool | None = None,
        approx_instant_energy: bool = False,
    ) -> None:
        """Open the log and read its header.

        Args:
            gpu_indices: Ignored (the log's header decides); a warning says so if they differ.
            monitor_exec: Ignored; zeus 0.8's executable name. (Zeus 0.16's second positional
                argument, `approx_instant_energy`, lands here too and is ignored as well.)
            log_file: The log to replay (required).
            ignore_sync_cuda: Accept and ignore `sync_cuda`/`sync_execution` (kept for
                compatibility: replaying never synchronises anything). zeus 0.8's name.
            match_window_name: Check that each `end_window` key matches the line's window name.
            ignore_sync_execution: Zeus 0.16's name of `ignore_sync_cuda` (keyword only).
            approx_instant_energy: Zeus 0.16's argument (keyword only); kept as an attribute,
                unused (the log holds the energies).

        Raises:
            ValueError: no `log_file`; `ignore_sync_cuda` and `ignore_sync_execution` given
                with different values; or a header without `gpu<i>_energy` or
                `cpu<i>_energy` columns, or with a column of another name.

        """
        del monitor_exec
        if log_file is None:
            raise ValueError("ReplayZeusMonitor requires log_file, the ZeusMonitor log to replay")
        if (
            ignore_sync_cuda is not None
            and ignore_sync_execution is not None
            and bool(ignore_sync_cuda) != bool(ignore_sync_execution)
        ):
            raise ValueError(
                f"ignore_sync_cuda={ignore_sync_cuda!r} and ignore_sync_execution="
                f"{ignore_sync_execution!r} disagree (the same setting; give one)"
            )
        ignore = ignore_sync_execution if ignore_sync_execution is not None else ignore_sync_cuda
        self.log_file = os.fspath(log_file)
        self.ignore_sync_cuda = self.ignore_sync_execution = bool(ignore)
        self.approx_instant_energy = bool(approx_instant_energy)
        self.match_window_name = match_window_name
        self._file = open(self.log_file, newline="")
        self._reader: Iterator[list[str]] = csv.reader(self._file)
        try:
            header = next(self._reader)
        except StopIteration:
            self._file.close()
            raise ValueError(f"log file {self.log_file} is empty") from None
        self._columns = len(header)
        # Per column after the first three: (kind, index, is its bound).
        self._layout: list[tuple[str, int, bool]] = []
        for col in header[3:]:
            match = _COLUMN.match(col)
            if match is None:
                self._file.close()
                raise ValueError(f"log file {self.log_file}: unexpected column {col!r}")
            self._layout.append((match.group(1), int(match.group(2)), match.group(3) is not None))
        indices = self._indices("gpu")
        cpus = self._indices("cpu")
        if header[:3] != ["start_time", "window_name", "elapsed_time"] or not (indices or cpus):
            self._file.close()
            raise ValueError(f"log file {self.log_file} has no ZeusMonitor header: {header}")
        if gpu_indices is not None and list(gpu_indices) != indices:
            warnings.warn(
                f"ReplayZeusMonitor uses the log's GPUs {indices}, not gpu_indices="
                f"{list(gpu_indices)}",
                stacklevel=2,
            )
        self.gpu_indices = indices
        self.nvml_gpu_indices = list(indices)
        self.cpu_indices: list[int] | None = cpus or None
        self._ongoing: set[str] = set()

    def _indices(self, kind: str) -> list[int]:
        """The indices of the log's `<kind><i>_energy` columns, in column order."""
        return [i for k, i, bound in self._layout if k == kind and not bound]

    def begin_window(
        self,
        key: str,
        sync_cuda: bool = True,
        sync_execution: bool = True,
        restart: bool = False,
    ) -> None:
        """Open window `key`.

        Args:
            key: The window's name.
            sync_cuda: Ignored (nothing runs on a GPU).
            sync_execution: Ignored; Zeus 0.16's name of `sync_cuda`.
            restart: When `key` is open, open it again instead of raising (Zeus 0.16).

        Raises:
            RuntimeError: `key` is already open (and `restart` is False).

        """
        if key in self._ongoing and not restart:
            raise RuntimeError(f"Window {key} is already ongoing.")
        self._ongoing.add(key)

    def end_window(
        self, key: str, sync_cuda: bool = True, cancel: bool = False, sync_execution: bool = True
    ) -> Any:
        """Close window `key` and return the next logged `Measurement`.

        Raises:
            RuntimeError: `key` is not open, the log is exhausted, the line's window name differs
                (with `match_window_name`), or the line has the wrong number of columns.

        """
        if key not in self._ongoing:
            raise RuntimeError(f"Window {key} is not ongoing.")
        self._ongoing.discard(key)
        if cancel:
            zeros = {
                f"{kind}_energy": dict.fromkeys(self._indices(kind), 0.0)
                for kind in ("cpu", "dram")
                if self._indices(kind)
            }
            return _measurement(0.0, dict.fromkeys(self.gpu_indices, 0.0), **zeros)
        try:
            row = next(self._reader)
        except StopIteration:
            raise RuntimeError("No more lines in the log file.") from None
        if len(row) != self._columns:
            raise RuntimeError(
                f"Line {row} of {self.log_file} has {len(row)} columns, expected {self._columns}."
            )
        if self.match_window_name and row[1] != key:
            raise RuntimeError(f"Was expecting {row[1]}, not {key}.")
        values: dict[tuple[str, bool], dict[int, float]] = {}
        for (kind, i, bound), v in zip(self._layout, row[3:]):
            values.setdefault((kind, bound), {})[i] = float(v)
        extra: dict[str, dict[int, float]] = {}
        names = {
            ("cpu", False): "cpu_energy",
            ("dram", False): "dram_energy",
            ("gpu", True): "gpu_energy_uncertainty",
            ("cpu", True): "cpu_energy_uncertainty",
            ("dram", True): "dram_energy_uncertainty",
        }
        for slot, name in names.items():
            if slot in values:
                extra[name] = values[slot]
        return _measurement(float(row[2]), values.get(("gpu", False), {}), **extra)

    def close(self) -> None:
        """Close the log file."""
        self._file.close()

    def __del__(self) -> None:
        """Close the log file."""
        f = getattr(self, "_file", None)
        if f is not None:
            f.close()
