"""Analyse the logs zeus writes (the reference's `zeus.analyze`), and plot them.

Energy and average power:

- `energy` and `avg_power` integrate the power in any power log `read_power_log` reads: the
  reference's `zeus-monitor LOGFILE DURATION SLEEP_MS` CSV (a `Time` column such as
  `2022-07-13 02:07:36.708783111` and a `Power` column in milliwatts, read to the nanosecond),
  the multi-GPU CSV and the JSON lines of `zeus-monitor` and `python -m zeus.monitor power`, a
  `PowerMonitor` timeline dump and a `ZeusMonitor` log file. Only numpy is needed.

Plots (matplotlib, the `plot` extra), each into a PNG, SVG or PDF:

- `plot_power`: power timelines of power logs, one line per GPU;
- `plot_windows`: the energy of each measurement window of a `ZeusMonitor` log file, one panel
  per window name (nested `step` and `epoch` windows get one each);
- `plot_profile`: the time and energy per power limit of a `GlobalPowerLimitOptimizer` profile
  file (`profile_path=`), the chosen limit marked;
- `plot_simulation`: energy and time per recurrence of `python -m zeus.simulate --output` runs;
- `plot_serving`: J per output token against batch size, one point per request of
  `EnergyLedger(log_path=...)` logs (`read_ledger_log`), with each model's median per batch
  size range (`joules_per_token_by_batch`, printed as a table by the command line).

`python -m zeus.analyze energy|avg-power|plot|plot-windows|plot-profile|plot-simulation|serving`
is the command line.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Sequence, Union

import numpy as np

from zeus.optimizer.recurring.job import (
    HistoryEntry,
)  # the reference defined it here; one class serves both

if TYPE_CHECKING:
    from zeus.optimizer.power_limit import OptimumSelector, PowerLimitMeasurement

__all__ = [
    "BatchBucket",
    "HistoryEntry",
    "LedgerRecord",
    "PowerSeries",
    "Recurrence",
    "Window",
    "avg_power",
    "energy",
    "format_batch_table",
    "joules_per_token_by_batch",
    "plot_power",
    "plot_profile",
    "plot_serving",
    "plot_simulation",
    "plot_windows",
    "read_ledger_log",
    "read_monitor_log",
    "read_power_log",
    "read_profile",
    "read_simulation_history",
]

_Path = Union[str, os.PathLike[str]]

# At most this many window names go into one `plot_windows` figure unless the caller names them.
_MAX_WINDOW_PANELS = 6


# ---------------------------------------------------------------------------------------------
# The reference's CSV, read to the nanosecond.


def _read(logfile: _Path, drop_last: bool) -> tuple[np.ndarray, np.ndarray]:
    """Timestamps (datetime64[ns]) and power (W) of a `zeus-monitor` log."""
    with open(logfile, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"{os.fspath(logfile)!r} is empty: expected a 'Time,Power' header")
    header = [h.strip() for h in rows[0]]
    try:
        t_col, p_col = header.index("Time"), header.index("Power")
    except ValueError:
        raise ValueError(
            f"{os.fspath(logfile)!r} has columns {header}; expected 'Time' and 'Power'"
        ) from None
    body = [r for r in rows[1:] if r]
    if drop_last and body:
        # The reference reads with `skipfooter=1`: the last line may have been cut short by
        # the logger being killed, so it is never trusted.
        body = body[:-1]
    try:
        times = np.array([r[t_col] for r in body], dtype="datetime64[ns]")
        power_w = np.array([float(r[p_col]) for r in body], dtype=np.float64) / 1000.0
    except (ValueError, IndexError) as e:
        raise ValueError(f"{os.fspath(logfile)!r} has a malformed row: {e}") from None
    return times, power_w


def _is_reference_csv(logfile: _Path) -> bool:
    """Whether `logfile` is the one-GPU `Time,Power` CSV (the reference's format)."""
    with open(logfile, newline="") as f:
        first = f.readline()
    header = [h.strip() for h in first.split(",")]
    return "Time" in header and "Power" in header


def _window(
    seconds: np.ndarray,
    start: float | None,
    end: float | None,
    negative_from_end: bool,
) -> np.ndarray:
    """Mask of samples within `[start, end]` seconds of the first one.

    `seconds` counts from the first sample. Negative bounds count back from the last sample
    when `negative_from_end`.
    """
    mask = np.ones(len(seconds), dtype=bool)
    if len(seconds) == 0:
        return mask
    last = seconds[-1]

    def bound(offset: float) -> float:
        return float(last + offset) if (negative_from_end and offset < 0) else offset

    if start is not None:
        mask &= seconds >= bound(start)
    if end is not None:
        mask &= seconds <= bound(end)
    return mask


def _relative_seconds(times: np.ndarray) -> np.ndarray:
    return (times - times[0]).astype("timedelta64[ns]").astype(np.int64) / 1e9


def _area(logfile: _Path, seconds: np.ndarray, power_w: np.ndarray) -> float:
    if len(seconds) < 2:
        raise ValueError(
            f"At least 2 points are needed to compute area under curve, but {len(seconds)} "
            f"remain in {os.fspath(logfile)!r} after selecting the window"
        )
    return float(np.sum(np.diff(seconds) * (power_w[1:] + power_w[:-1]) / 2.0))


def _samples(logfile: _Path, drop_last: bool, gpu: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Seconds since the first sample and watts (summed over GPUs unless `gpu`) of any log."""
    if _is_reference_csv(logfile):
        times, power_w = _read(logfile, drop_last)
        return (_relative_seconds(times) if len(times) else np.zeros(0)), power_w
    series = read_power_log(logfile)
    if gpu is not None:
        if gpu not in series.watts:
            known = ", ".join(str(g) for g in series.watts)
            raise ValueError(f"{os.fspath(logfile)!r} has no GPU {gpu}; it logs GPUs {known}")
        columns = [series.watts[gpu]]
    else:
        columns = list(series.watts.values())
    if any(len(c) != len(series.times) for c in columns):
        raise ValueError(
            f"the GPUs of {os.fspath(logfile)!r} were sampled at different times; choose one "
            "(gpu=N, --gpu N)"
        )
    watts = np.sum(np.array(columns, dtype=np.float64), axis=0)
    seconds = np.array(series.times, dtype=np.float64)
    # A logger killed mid-line leaves a partial last sample; dumps and window logs are whole.
    if drop_last and series.kind == "power log" and len(seconds):
        seconds, watts = seconds[:-1], watts[:-1]
    return (seconds - seconds[0] if len(seconds) else seconds), watts


def energy(
    logfile: _Path,
    start: float | None = None,
    end: float | None = None,
    *,
    drop_last: bool = True,
    gpu: int | None = None,
) -> float:
    """Energy in joules logged in `logfile` (trapezoidal rule over power).

    Args:
        logfile: Any power log `read_power_log` reads: a `zeus-monitor` CSV (`Time`, `Power`
            in mW, or `Power0,Power1,...`) or JSON lines, `python -m zeus.monitor power`
            output, a `PowerMonitor` timeline dump or a `ZeusMonitor` log file.
        start: Seconds after the first sample to start at; negative counts back from the last.
        end: Seconds after the first sample to end at; negative counts back from the last.
        drop_last: Ignore the last sample of a power logger's output, as the reference does
            (it may be partial). Dumps and `ZeusMonitor` logs are used whole.
        gpu: The GPU index to count; default every GPU in the log, summed.

    Raises:
        ValueError: Fewer than two samples remain, the file is not such a log, or it has no
            GPU `gpu`.

    """
    seconds, power_w = _samples(logfile, drop_last, gpu)
    mask = _window(seconds, start, end, negative_from_end=True)
    seconds, power_w = seconds[mask], power_w[mask]
    return _area(logfile, seconds, power_w)


def avg_power(
    logfile: _Path,
    start: float | None = None,
    end: float | None = None,
    *,
    drop_last: bool = True,
    gpu: int | None = None,
) -> float:
    """Average power in watts logged in `logfile`: energy over the covered time span.

    Args:
        logfile: Any power log `read_power_log` reads (see `energy`).
        start: Seconds after the first sample to start at.
        end: Seconds after the first sample to end at.
        drop_last: Ignore the last sample of a power logger's output, as the reference does.
        gpu: The GPU index to count; default every GPU in the log, summed.

    Raises:
        ValueError: Fewer than two samples remain, the file is not such a log, or it has no
            GPU `gpu`.

    """
    seconds, power_w = _samples(logfile, drop_last, gpu)
    mask = _window(seconds, start, end, negative_from_end=False)
    seconds, power_w = seconds[mask], power_w[mask]
    area = _area(logfile, seconds, power_w)
    return area / float(seconds.max() - seconds.min())


# ---------------------------------------------------------------------------------------------
# Reading the logs.


@dataclass
class PowerSeries:
    """Power of some GPUs over time, read from a log by `read_power_log`.

    Attributes:
        times: Seconds (Unix time where the log has it), one per sample.
        watts: GPU index (or `None` where the log does not say which GPU) to watts per sample.
        steps: Whether each sample holds until the next one (a `ZeusMonitor` log's windows:
            average power over each window) rather than being a point reading.
        label: What the series is called in a legend (the file's name for a file).
        kind: `"power log"` (written sample by sample by a logger), `"PowerMonitor dump"` or
            `"ZeusMonitor log"`.

    """

    times: list[float]
    watts: dict[int | None, list[float]] = field(default_factory=dict)
    steps: bool = False
    label: str = ""
    kind: str = "power log"


@dataclass(frozen=True)
class Window:
    """One measurement window of a `ZeusMonitor` log file.

    Attributes:
        name: The window's name.
        start: When it began (the monitor's clock, Unix seconds on a real clock).
        elapsed: Its length, seconds.
        energy: Joules by device: `"gpu0"`, ..., and where the log has them `"cpu0"` (package)
            and `"dram0"`.

    """

    name: str
    start: float
    elapsed: float
    energy: dict[str, float]


def _seconds_of(stamp: str) -> float:
    return float(np.datetime64(stamp.strip(), "ns").astype(np.int64)) / 1e9


def _gpu_of(column: str, prefix: str, suffix: str) -> int | None:
    middle = column[len(prefix) : len(column) - len(suffix)]
    return int(middle) if middle.isdigit() else None


def _device_of(column: str) -> str | None:
    """`gpu3` for `gpu3_energy` (likewise `cpuN`, `dramN`); `None` for any other column."""
    for kind in ("gpu", "cpu", "dram"):
        if column.startswith(kind) and column.endswith("_energy"):
            if _gpu_of(column, kind, "_energy") is not None:
                return column[: -len("_energy")]
    return None


def read_monitor_log(path: _Path) -> list[Window]:
    """The windows of a `ZeusMonitor(log_file=...)` log, in the order they ended.

    The file's header is `start_time,window_name,elapsed_time,gpu0_energy,...`, then CPU and
    DRAM columns where CPUs were measured, then the `_uncertainty` bounds (not read here).

    Raises:
        ValueError: the file is not such a log.

    """
    name = os.fspath(path)
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = [h.strip() for h in rows[0]] if rows else []
    if header[:3] != ["start_time", "window_name", "elapsed_time"]:
        raise ValueError(
            f"{name!r} is not a ZeusMonitor log file (header {header[:4]}); expected "
            "start_time,window_name,elapsed_time,gpu0_energy,..."
        )
    devices = [(k, d) for k, h in enumerate(header) if k >= 3 and (d := _device_of(h))]
    windows = []
    for line, r in enumerate(rows[1:], start=2):
        if len(r) != len(header):
            continue  # a row cut short by a killed process
        try:
            windows.append(
                Window(r[1], float(r[0]), float(r[2]), {d: float(r[k]) for k, d in devices})
            )
        except ValueError as e:
            raise ValueError(f"{name!r} line {line}: {e}") from None
    return windows


def _innermost(spans: list[tuple[float, float]]) -> list[int]:
    """Indices of the spans `(start, end)` that hold no other span, by start.

    Of identical spans only the first counts. A `ZeusMonitor` log with `step` windows inside
    `epoch` windows thus gives its steps (and epochs only where they hold no step).
    """
    first: dict[tuple[float, float], int] = {}
    for k, span in enumerate(spans):
        first.setdefault(span, k)
    unique = sorted(first, key=lambda s: (s[0], -s[1]))
    keep = []
    earliest_end_after = math.inf
    # A later span in this order starts no earlier; it lies inside when it ends no later.
    for span in reversed(unique):
        if earliest_end_after > span[1]:
            keep.append(first[span])
        earliest_end_after = min(earliest_end_after, span[1])
    return sorted(keep, key=lambda k: spans[k])


def _choose_windows(
    name: str, windows: list[Window], chosen: Sequence[str] | None
) -> tuple[list[Window], list[str]]:
    """The windows whose names are `chosen` (all if `None`), and the names, in file order."""
    present = list(dict.fromkeys(w.name for w in windows))
    if chosen is None:
        return windows, present
    unknown = [c for c in chosen if c not in present]
    if unknown:
        raise ValueError(
            f"{name!r} has no window named {', '.join(repr(u) for u in unknown)}; its windows: "
            f"{', '.join(present) or 'none'}"
        )
    names = list(dict.fromkeys(chosen))
    return [w for w in windows if w.name in names], names


def _read_json_lines(name: str, lines: list[str]) -> PowerSeries:
    series = PowerSeries(times=[], label=os.path.basename(name))
    lines = [ln for ln in lines if ln.strip()]
    for number, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break  # the last line of a logger killed mid-write
            raise ValueError(f"{name!r} line {number} is not JSON: {line.strip()[:80]}") from None
        if not isinstance(row, dict) or "power_mw" not in row:
            raise ValueError(f"{name!r}: a JSON line without power: {line.strip()[:80]}")
        series.times.append(float(row["unix_time"]))
        for gpu, mw in row["power_mw"].items():
            series.watts.setdefault(int(gpu), []).append(float(mw) / 1000.0)
    return series


def read_power_log(path: _Path, windows: Sequence[str] | None = None) -> PowerSeries:
    """Read any power log zeus writes, by its content.

    - the power log of `zeus-monitor` and `python -m zeus.monitor power`: CSV (`Time,Power` or
      `Time,Power0,Power1,...`, mW) and JSON lines (`{"time", "unix_time", "power_mw"}`);
    - a `PowerMonitor` timeline dump: `json.dump(pm.get_all_power_timelines(), f)` (its first
      domain is plotted) or `json.dump(pm.get_power_timeline(), f)`;
    - a `ZeusMonitor` log file (`start_time,window_name,elapsed_time,gpu0_energy,...`), as the
      average power of each window. Of windows inside others (`step` windows in an `epoch`)
      only the innermost are read, so the timeline never runs back in time.

    Args:
        path: The log.
        windows: For a `ZeusMonitor` log, the window names to read (default all).

    Raises:
        ValueError: the file is none of these, naming it and what it found, or it has no
            window of a name in `windows`.

    """
    name = os.fspath(path)
    label = os.path.basename(name)
    with open(path, newline="") as f:
        first = f.readline()
        rest = f.read()
    if not first.strip():
        raise ValueError(f"{name!r} is empty")
    if first.lstrip().startswith("{") and not rest.strip():
        dump = json.loads(first)
        if dump and all(isinstance(v, dict) for v in dump.values()):
            dump = next(iter(dump.values()))  # {domain: {gpu: [[t, W], ...]}}: the first domain
        if dump and all(isinstance(v, list) for v in dump.values()):  # {gpu: [[t, W], ...]}
            gpus = sorted(dump, key=int)
            series = PowerSeries(
                times=[float(t) for t, _ in dump[gpus[0]]], label=label, kind="PowerMonitor dump"
            )
            for g in gpus:
                series.watts[int(g)] = [float(w) for _, w in dump[g]]
            return series
    if first.lstrip().startswith("{"):
        return _read_json_lines(name, [first, *rest.splitlines()])
    header = [h.strip() for h in next(csv.reader([first]))]
    if header[:3] == ["start_time", "window_name", "elapsed_time"]:
        chosen, _ = _choose_windows(name, read_monitor_log(path), windows)
        chosen = [w for w in chosen if w.elapsed > 0]
        keep = _innermost([(w.start, w.start + w.elapsed) for w in chosen])
        series = PowerSeries(times=[], steps=True, label=label, kind="ZeusMonitor log")
        # GPU energy only (not CPU/DRAM, nor the `_uncertainty` bounds).
        gpus = [d for d in (chosen[0].energy if chosen else {}) if d.startswith("gpu")]
        for k in keep:
            w = chosen[k]
            series.times += [w.start, w.start + w.elapsed]
            for d in gpus:
                watts = w.energy[d] / w.elapsed
                series.watts.setdefault(int(d[3:]), []).extend([watts, watts])
        return series
    if header and header[0] == "Time":  # the power log's CSV, mW
        rows = list(csv.reader(rest.splitlines()))
        body = [r for r in rows if r and len(r) == len(header)]
        power_columns = [
            (k, _gpu_of(h, "Power", "")) for k, h in enumerate(header) if h.startswith("Power")
        ]
        series = PowerSeries(times=[_seconds_of(r[0]) for r in body], label=label)
        for k, gpu in power_columns:
            series.watts[gpu] = [float(r[k]) / 1000.0 for r in body]
        return series
    raise ValueError(
        f"{name!r} is not a power log zeus writes (header {header[:4]}); expected a zeus-monitor "
        "or python -m zeus.monitor power log (CSV with 'Time' and 'Power' columns, or JSON "
        "lines), a PowerMonitor dump or a ZeusMonitor log file"
    )


def read_profile(path: _Path) -> list[PowerLimitMeasurement]:
    """The measurements of a `GlobalPowerLimitOptimizer(profile_path=...)` profile file.

    The file reads `{"measurements": [{"power_limit": W, "energy": J, "time": s}, ...]}`, one
    entry per profiled limit, each over the optimizer's `profile_steps` steps.

    Raises:
        ValueError: the file is not such a profile.

    """
    from pydantic import ValidationError

    from zeus.optimizer.power_limit import PowerLimitMeasurement

    name = os.fspath(path)
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
        entries = data["measurements"]
        if not isinstance(entries, list) or not entries:
            raise TypeError("no measurements")
        return [PowerLimitMeasurement.model_validate(e) for e in entries]
    except (ValueError, KeyError, TypeError, ValidationError) as e:
        first = " ".join(str(e).split())[:120]
        raise ValueError(
            f"{name!r} is not a power limit profile ({first}); expected "
            '{"measurements": [{"power_limit": W, "energy": J, "time": s}, ...]}'
        ) from None


@dataclass(frozen=True)
class Recurrence:
    """One recurrence of a simulated job, from `python -m zeus.simulate --output` history.

    Attributes:
        rec: The recurrence's number.
        tries: How many runs it took (a run stopped early is retried).
        energy: Joules of all its runs.
        time: Seconds of all its runs.
        batch_size: The batch size of its last run.
        power_limit: The power limit (W) of its last run.
        reached: Whether its last run reached the target metric.

    """

    rec: int
    tries: int
    energy: float
    time: float
    batch_size: int
    power_limit: int
    reached: bool


_HISTORY_HEADER = ["rec", "try", "batch_size", "power_limit", "energy", "time", "reached"]


def read_simulation_history(path: _Path) -> list[Recurrence]:
    """The recurrences of a `python -m zeus.simulate --output FILE` history, in order.

    Raises:
        ValueError: the file is not such a history.

    """
    name = os.fspath(path)
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = [h.strip() for h in rows[0]] if rows else []
    if header != _HISTORY_HEADER:
        raise ValueError(
            f"{name!r} is not a python -m zeus.simulate history (header {header[:4]}); "
            f"expected {','.join(_HISTORY_HEADER)}"
        )
    # Per recurrence: (batch size, power limit, energy, time, reached) of each run.
    by_rec: dict[int, list[tuple[int, int, float, float, bool]]] = {}
    for line, r in enumerate(rows[1:], start=2):
        if not r:
            continue
        if len(r) != len(header):
            raise ValueError(f"{name!r} line {line} has {len(r)} columns, not {len(header)}")
        try:
            run = (int(r[2]), int(r[3]), float(r[4]), float(r[5]), r[6].strip().lower() == "true")
            by_rec.setdefault(int(r[0]), []).append(run)
        except ValueError as e:
            raise ValueError(f"{name!r} line {line}: {e}") from None
    out = []
    for rec, runs in sorted(by_rec.items()):
        bs, pl, _, _, reached = runs[-1]
        out.append(
            Recurrence(
                rec=rec,
                tries=len(runs),
                energy=sum(run[2] for run in runs),
                time=sum(run[3] for run in runs),
                batch_size=bs,
                power_limit=pl,
                reached=reached,
            )
        )
    return out


@dataclass(frozen=True)
class LedgerRecord:
    """One request of an `EnergyLedger(log_path=...)` log, as `read_ledger_log` reads it.

    The line is `RequestEnergy.to_json()`; the fields read are those below (the time stamps,
    token counts and per-GPU split are not).

    Attributes:
        request_id: The engine's id of the request.
        model: The model it was served by.
        labels: Its user labels.
        method: How step energy was split (`time`, `tokens`, `work`).
        finished: False for a request still open when the ledger closed.
        energy: Its energy, J.
        energy_bound: The bound of `energy`, J.
        prefill_energy: The part spent in prefill, J.
        decode_energy: The part spent in decode, J.
        output_tokens: Tokens it generated.
        steps: Engine steps it ran in.
        mean_batch: Mean number of requests in those steps.

    """

    request_id: str
    model: str
    labels: dict[str, str]
    method: str
    finished: bool
    energy: float
    energy_bound: float
    prefill_energy: float
    decode_energy: float
    output_tokens: float
    steps: int
    mean_batch: float

    @property
    def joules_per_output_token(self) -> float:
        """Energy per generated token, J (NaN for a request that generated none)."""
        return self.energy / self.output_tokens if self.output_tokens else math.nan


# Fields every line must have, and those read when present (with their value otherwise).
_LEDGER_REQUIRED = ("request_id", "model", "finished", "energy", "output_tokens", "mean_batch")
_LEDGER_OPTIONAL: dict[str, Any] = {
    "labels": {},
    "method": "",
    "energy_bound": math.nan,
    "prefill_energy": math.nan,
    "decode_energy": math.nan,
    "steps": 0,
}


def _ledger_float(key: str, value: Any) -> float:
    if value is None:  # NaN, as `to_json` writes it
        return math.nan
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{key} {value!r} is not a number")
    return float(value)


def _ledger_record(row: dict[str, Any]) -> LedgerRecord:
    fields = {**_LEDGER_OPTIONAL, **row}
    labels = fields["labels"]
    if not isinstance(labels, dict):
        raise TypeError(f"labels {labels!r} is not an object")
    if not isinstance(fields["finished"], bool):
        raise TypeError(f"finished {fields['finished']!r} is not true or false")
    steps = fields["steps"]
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise TypeError(f"steps {steps!r} is not an integer")
    numbers = {
        key: _ledger_float(key, fields[key])
        for key in (
            "energy",
            "energy_bound",
            "prefill_energy",
            "decode_energy",
            "output_tokens",
            "mean_batch",
        )
    }
    return LedgerRecord(
        request_id=str(fields["request_id"]),
        model=str(fields["model"]),
        labels={str(k): str(v) for k, v in labels.items()},
        method=str(fields["method"]),
        finished=fields["finished"],
        steps=steps,
        **numbers,
    )


def read_ledger_log(path: _Path) -> list[LedgerRecord]:
    """The requests of an `EnergyLedger(log_path=...)` log (JSON lines), in the file's order.

    Blank lines are skipped, and so is a last line cut short (not JSON, with no newline after
    it), as a process killed while writing leaves it.

    Raises:
        ValueError: a line that is not JSON, not a ledger record, or has a field of the wrong
            type; the message names the file and the line number.

    """
    name = os.fspath(path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines) and not text.endswith("\n"):
                break  # the last line of a process killed mid-write
            raise ValueError(
                f"{name!r} line {number} is not JSON ({e.msg}): {line.strip()[:80]}"
            ) from None
        missing = [k for k in _LEDGER_REQUIRED if k not in row] if isinstance(row, dict) else []
        if not isinstance(row, dict) or missing:
            raise ValueError(
                f"{name!r} line {number} is not an EnergyLedger record"
                + (f" (no {', '.join(missing)})" if missing else "")
                + f": {line.strip()[:80]}"
            )
        try:
            records.append(_ledger_record(row))
        except TypeError as e:
            raise ValueError(f"{name!r} line {number}: {e}") from None
    return records


@dataclass(frozen=True)
class BatchBucket:
    """Requests of one model whose mean batch size lies in `[low, high)`: their J per token.

    Attributes:
        model: The model.
        low: The smallest mean batch size of the bucket (a power of two).
        high: The bucket's end (twice `low`), exclusive.
        requests: How many requests.
        median_batch: Their median mean batch size.
        median_joules_per_output_token: The median of their J per output token.

    """

    model: str
    low: float
    high: float
    requests: int
    median_batch: float
    median_joules_per_output_token: float


def _per_token_usable(r: LedgerRecord) -> bool:
    """Finished, generated tokens, ran in steps: a J/token at a batch size."""
    return (
        r.finished
        and r.output_tokens > 0
        and math.isfinite(r.energy)
        and math.isfinite(r.mean_batch)
        and r.mean_batch > 0
    )


def joules_per_token_by_batch(records: Sequence[LedgerRecord]) -> list[BatchBucket]:
    """The median J per output token of each model's requests, by mean batch size.

    Buckets double: `[1, 2)`, `[2, 4)`, `[4, 8)`, ... (a mean below 1 goes to the first).
    Only finished requests that generated tokens count: an unfinished one (open when the ledger
    closed) spent energy on tokens it never delivered. The median is of each request's own
    J/token, so a few long requests do not speak for the bucket.

    Returns:
        One bucket per model and batch size range holding requests: models in the order they
        first appear, buckets by batch size.

    """
    groups: dict[str, dict[int, list[LedgerRecord]]] = {}
    for r in records:
        if not _per_token_usable(r):
            continue
        k = max(0, math.floor(math.log2(r.mean_batch)))
        groups.setdefault(r.model, {}).setdefault(k, []).append(r)
    out = []
    for model, buckets in groups.items():
        for k, rs in sorted(buckets.items()):
            out.append(
                BatchBucket(
                    model=model,
                    low=float(2**k),
                    high=float(2 ** (k + 1)),
                    requests=len(rs),
                    median_batch=float(np.median([r.mean_batch for r in rs])),
                    median_joules_per_output_token=float(
                        np.median([r.joules_per_output_token for r in rs])
                    ),
                )
            )
    return out


def format_batch_table(buckets: Sequence[BatchBucket]) -> str:
    """`joules_per_token_by_batch`'s buckets as a text table, one line per bucket."""
    header = ("model", "mean batch", "requests", "median batch", "median J/token")
    rows = [
        (
            b.model or "(none)",
            f"[{b.low:g}, {b.high:g})",
            str(b.requests),
            f"{b.median_batch:.3g}",
            f"{b.median_joules_per_output_token:.4g}",
        )
        for b in buckets
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = []
    for r in (header, *rows):
        # The model name left-aligned, the figures right-aligned.
        cells = [r[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(r[1:], widths[1:]))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Plots.


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure(size: tuple[int, int], rows: int = 1) -> tuple[Any, list[Any]]:
    """A figure of `size` pixels with `rows` panels sharing their x axis."""
    plt = _pyplot()
    dpi = 100
    fig, axes = plt.subplots(
        rows,
        1,
        figsize=(size[0] / dpi, size[1] / dpi),
        dpi=dpi,
        sharex=True,
        squeeze=False,
        layout="constrained",
    )
    return fig, [row[0] for row in axes]


def _shared_legend(fig: Any, ax: Any) -> None:
    """One legend for every panel (their lines are alike), under them."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 4))


def _save(fig: Any, output: _Path) -> Any:
    fig.savefig(output, dpi=fig.dpi)
    _pyplot().close(fig)
    return fig


def _scale(largest: float, units: Sequence[tuple[float, str]]) -> tuple[float, str]:
    """The divisor and unit (from `units`, ascending) that keep `largest` readable."""
    chosen = units[0]
    for divisor, unit in units:
        if largest >= 10 * divisor:
            chosen = (divisor, unit)
    return chosen


_ENERGY_UNITS = ((1.0, "J"), (1e3, "kJ"), (1e6, "MJ"), (1e9, "GJ"))
_DURATION_UNITS = ((1.0, "s"), (60.0, "min"), (3600.0, "h"))


def _elapsed_unit(span_s: float) -> tuple[float, str]:
    """Seconds up to 10 minutes, then minutes up to 10 hours, then hours."""
    if span_s <= 600:
        return 1.0, "s"
    return (60.0, "min") if span_s <= 36000 else (3600.0, "h")


def _since(origin: float) -> str:
    """` since 2024-05-01 12:00:00 UTC` where `origin` looks like Unix time, else nothing."""
    if origin < 1e9:  # a monotonic or virtual clock
        return ""
    stamp = datetime.fromtimestamp(origin, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return f" since {stamp} UTC"


def _model_names(gpu_names: dict[int, str] | None) -> dict[int, str]:
    """`gpu_names`, else the models of the GPUs visible here, else none."""
    if gpu_names:
        return dict(gpu_names)
    try:
        from zeus.device import get_gpus

        gpus = get_gpus()
        return {i: gpus.get_name(i) for i in range(len(gpus))}
    except Exception:
        return {}


def _gpu_label(gpu: int | None, names: dict[int, str]) -> str:
    """`GPU0 (NVIDIA A40)`; for a log that does not say which GPU, the model if only one."""
    if gpu is None:
        models = set(names.values())
        return f"GPU ({models.pop()})" if len(models) == 1 else "GPU"
    return f"GPU{gpu} ({names[gpu]})" if gpu in names else f"GPU{gpu}"


def _device_label(device: str, names: dict[int, str]) -> str:
    if device.startswith("gpu"):
        return _gpu_label(int(device[3:]), names)
    if device.startswith("cpu"):
        return f"CPU{device[3:]} package"
    return f"CPU{device[4:]} DRAM"


def plot_power(
    paths: Sequence[_Path | PowerSeries],
    output: _Path,
    gpu_names: dict[int, str] | None = None,
    size: tuple[int, int] = (1200, 600),
    *,
    title: str | None = None,
    windows: Sequence[str] | None = None,
) -> Any:
    """Plot the power timelines of `paths` into `output` (PNG, SVG, PDF: by its extension).

    One line per GPU per file, on a power axis that starts at zero. The legend names each
    GPU's model from `gpu_names`, else from the GPUs visible here (`zeus.device`), else by index
    only; a log that does not say which GPU it measured (the one-GPU `Time,Power` CSV) gets
    the model where only one is known. Needs matplotlib (the `plot` extra).

    Args:
        paths: Power logs (anything `read_power_log` reads), or series already read.
        output: The image file.
        gpu_names: Model names by GPU index.
        size: Pixels, width and height.
        title: The figure's title; default `GPU power: <file names>`.
        windows: For `ZeusMonitor` logs, the window names to draw (default all, innermost).

    Returns:
        The matplotlib figure.

    """
    names = _model_names(gpu_names)
    series = [p if isinstance(p, PowerSeries) else read_power_log(p, windows) for p in paths]
    fig, (ax,) = _figure(size)
    origin = min((s.times[0] for s in series if s.times), default=0.0)
    end = max((s.times[-1] for s in series if s.times), default=0.0)
    divisor, unit = _elapsed_unit(end - origin)
    for s in series:
        t = [(x - origin) / divisor for x in s.times]
        for gpu, watts in s.watts.items():
            label = _gpu_label(gpu, names)
            if len(series) > 1:
                label = f"{s.label}: {label}"
            ax.plot(t, watts, label=label, drawstyle="steps-post" if s.steps else "default")
    if title is None:
        labels = [s.label for s in series]
        title = "GPU power: " + (", ".join(labels) if len(labels) <= 3 else f"{len(labels)} logs")
    ax.set_title(title)
    ax.set_xlabel(f"time ({unit}){_since(origin)}")
    ax.set_ylabel("power (W)")
    # From zero: a flat 202 W must not look like swings.
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    return _save(fig, output)


def plot_windows(
    path: _Path,
    output: _Path,
    names: Sequence[str] | None = None,
    gpu_names: dict[int, str] | None = None,
    size: tuple[int, int] = (1200, 600),
    *,
    title: str | None = None,
) -> Any:
    """Plot the energy of each window of a `ZeusMonitor` log file over time.

    One panel per window name, as windows of one name are alike and windows of different
    names (a `step` inside an `epoch`) are not: each panel has one point per window, at its
    start, and one line per device measured (GPUs, and CPU packages and DRAM where the log has
    them), on an energy axis from zero.

    Args:
        path: A `ZeusMonitor(log_file=...)` log.
        output: The image file (PNG, SVG, PDF).
        names: The window names to plot, a panel each, in this order; default every name in
            the file (at most six: name them when there are more).
        gpu_names: Model names by GPU index (default: the GPUs visible here).
        size: Pixels, width and height.
        title: The figure's title; default `Energy per window: <file name>`.

    Returns:
        The matplotlib figure.

    Raises:
        ValueError: not a `ZeusMonitor` log, a name it does not have, no windows, or more
            than six names and none chosen.

    """
    file = os.fspath(path)
    windows, chosen = _choose_windows(file, read_monitor_log(path), names)
    if not windows:
        raise ValueError(f"{file!r} holds no window")
    if names is None and len(chosen) > _MAX_WINDOW_PANELS:
        raise ValueError(
            f"{file!r} has {len(chosen)} window names ({', '.join(chosen)}); choose up to "
            f"{_MAX_WINDOW_PANELS} (names=[...], --window NAME)"
        )
    models = _model_names(gpu_names)
    origin = min(w.start for w in windows)
    divisor, unit = _elapsed_unit(max(w.start for w in windows) - origin)
    fig, axes = _figure(size, rows=len(chosen))
    for ax, name in zip(axes, chosen):
        rows = sorted((w for w in windows if w.name == name), key=lambda w: w.start)
        largest = max((j for w in rows for j in w.energy.values()), default=0.0)
        e_div, e_unit = _scale(largest, _ENERGY_UNITS)
        x = [(w.start - origin) / divisor for w in rows]
        for device in rows[0].energy:
            ax.plot(
                x,
                [w.energy[device] / e_div for w in rows],
                marker="o" if len(rows) <= 60 else None,
                markersize=3,
                label=_device_label(device, models),
            )
        mean = sum(w.elapsed for w in rows) / len(rows)
        ax.set_title(f"window '{name}': {len(rows)} windows, {mean:.3g} s each on average")
        ax.set_ylabel(f"energy ({e_unit})")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    _shared_legend(fig, axes[0])
    axes[-1].set_xlabel(f"window start ({unit}){_since(origin)}")
    fig.suptitle(title or f"Energy per window: {os.path.basename(file)}")
    return _save(fig, output)


def plot_profile(
    path: _Path,
    output: _Path,
    selector: OptimumSelector | None = None,
    chosen: int | None = None,
    size: tuple[int, int] = (1200, 600),
    *,
    title: str | None = None,
) -> Any:
    """Plot a `GlobalPowerLimitOptimizer` profile: energy and time per power limit.

    Two panels over the power limit (W): the energy and the time each profiled limit took
    (over the optimizer's `profile_steps` steps), both from zero, the chosen limit marked by
    a star and a dashed line.

    Args:
        path: The optimizer's profile file (`profile_path=`).
        output: The image file (PNG, SVG, PDF).
        selector: How the limit was chosen; default the optimizer's default on one GPU,
            `ZeusCost(eta_knob=0.5)` (the file does not record the selector).
        chosen: The chosen limit in W, instead of asking `selector`.
        size: Pixels, width and height.
        title: The figure's title; default names the file and the choice.

    Returns:
        The matplotlib figure.

    Raises:
        ValueError: not a profile, or `chosen` is not a profiled limit.

    """
    file = os.fspath(path)
    profiled = read_profile(path)
    if chosen is None:
        if selector is None:
            from zeus.optimizer.power_limit import ZeusCost

            selector = ZeusCost(eta_knob=0.5)
        # In the file's order, the profiling order, which selectors break ties by.
        chosen = int(selector.select(profiled))
        how = repr(selector)
    else:
        how = "given"
    measurements = sorted(profiled, key=lambda m: m.power_limit)
    limits = [m.power_limit for m in measurements]
    if chosen not in limits:
        raise ValueError(
            f"the chosen limit {chosen} W is not among the profiled ones of {file!r}: {limits}"
        )
    best = measurements[limits.index(chosen)]
    fig, (ax_e, ax_t) = _figure(size, rows=2)
    panels = (
        (ax_e, [m.energy for m in measurements], best.energy, _ENERGY_UNITS, "energy"),
        (ax_t, [m.time for m in measurements], best.time, _DURATION_UNITS, "time"),
    )
    for ax, values, at_best, units, what in panels:
        div, unit = _scale(max(values), units)
        ax.plot(limits, [v / div for v in values], marker="o", label=what)
        ax.axvline(chosen, color="tab:red", linestyle="--", alpha=0.6)
        ax.plot(
            [chosen],
            [at_best / div],
            marker="*",
            markersize=14,
            color="tab:red",
            linestyle="none",
            label=f"chosen: {chosen} W",
        )
        ax.set_ylabel(f"{what} ({unit})")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
    ax_t.set_xlabel("power limit (W)")
    fig.suptitle(
        title or f"Power-limit profile {os.path.basename(file)}: chosen {chosen} W ({how})"
    )
    return _save(fig, output)


def plot_simulation(
    paths: Sequence[_Path],
    output: _Path,
    labels: Sequence[str] | None = None,
    size: tuple[int, int] = (1200, 600),
    *,
    title: str | None = None,
) -> Any:
    """Plot the energy and time of each recurrence of trace simulations.

    Two panels over the recurrence number, energy and time (all runs of a recurrence summed,
    retries included), from zero; one line per history file, for example the Zeus policy's
    against the baseline's (`python -m zeus.simulate --policy zeus|default --output FILE`).

    Args:
        paths: `python -m zeus.simulate --output` history files.
        output: The image file (PNG, SVG, PDF).
        labels: Legend entries, one per file; default the file names.
        size: Pixels, width and height.
        title: The figure's title.

    Returns:
        The matplotlib figure.

    Raises:
        ValueError: not a history, one without runs, or not one label per file.

    """
    if labels is not None and len(labels) != len(paths):
        raise ValueError(f"{len(labels)} labels for {len(paths)} history files")
    names = list(labels) if labels is not None else [os.path.basename(p) for p in paths]
    runs = [read_simulation_history(p) for p in paths]
    for path, recs in zip(paths, runs):
        if not recs:
            raise ValueError(f"{os.fspath(path)!r} holds no run")
    fig, (ax_e, ax_t) = _figure(size, rows=2)
    e_div, e_unit = _scale(max(r.energy for rs in runs for r in rs), _ENERGY_UNITS)
    t_div, t_unit = _scale(max(r.time for rs in runs for r in rs), _DURATION_UNITS)
    for name, recs in zip(names, runs):
        x = [r.rec for r in recs]
        ax_e.plot(x, [r.energy / e_div for r in recs], label=name)
        ax_t.plot(x, [r.time / t_div for r in recs], label=name)
    for ax, ylabel in ((ax_e, f"energy ({e_unit})"), (ax_t, f"time ({t_unit})")):
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    _shared_legend(fig, ax_e)
    ax_t.set_xlabel("recurrence")
    fig.suptitle(title or "Trace simulation: energy and time per recurrence")
    return _save(fig, output)


def plot_serving(
    paths: Sequence[_Path],
    output: _Path,
    size: tuple[int, int] = (1200, 600),
    *,
    title: str | None = None,
) -> Any:
    """Plot J per output token against batch size from `EnergyLedger` logs.

    One point per finished request that generated tokens, at its mean batch size (the mean
    number of requests in the engine steps it ran in), one colour per model; a line through
    each model's medians per batch size bucket (`joules_per_token_by_batch`). The J/token axis
    is logarithmic where the values span more than ten times, else from zero; the batch size
    axis is logarithmic (base 2) where they span more than four times.

    Args:
        paths: `EnergyLedger(log_path=...)` logs (their requests are plotted together).
        output: The image file (PNG, SVG, PDF).
        size: Pixels, width and height.
        title: The figure's title; default names the files and counts the requests.

    Returns:
        The matplotlib figure.

    Raises:
        ValueError: a file that is not such a log, or no finished request with tokens in all.

    """
    records = [r for p in paths for r in read_ledger_log(p)]
    usable = [r for r in records if _per_token_usable(r)]
    if not usable:
        names = ", ".join(repr(os.fspath(p)) for p in paths)
        raise ValueError(
            f"{names} hold no finished request that generated tokens "
            f"({len(records)} records, {sum(not r.finished for r in records)} unfinished)"
        )
    buckets = joules_per_token_by_batch(usable)
    models = list(dict.fromkeys(r.model for r in usable))
    fig, (ax,) = _figure(size)
    for i, model in enumerate(models):
        rs = [r for r in usable if r.model == model]
        color = f"C{i % 10}"
        ax.scatter(
            [r.mean_batch for r in rs],
            [r.joules_per_output_token for r in rs],
            s=12,
            alpha=0.5,
            color=color,
            label=f"{model or '(no model)'}: {len(rs)} request{'' if len(rs) == 1 else 's'}",
        )
        medians = [b for b in buckets if b.model == model]
        ax.plot(
            [b.median_batch for b in medians],
            [b.median_joules_per_output_token for b in medians],
            marker="D",
            color=color,
            label=f"{model or '(no model)'}: median per batch size range",
        )
    per_token = [r.joules_per_output_token for r in usable]
    if min(per_token) > 0 and max(per_token) > 10 * min(per_token):
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    batch = [r.mean_batch for r in usable]
    if max(batch) > 4 * min(batch):
        ax.set_xscale("log", base=2)
    else:
        ax.set_xlim(left=0)
    # Plain numbers (0.5, 16) on log axes too, not powers of ten or two; the minor ticks are
    # labelled only where the major ones are few (values within a factor of 100).
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for axis, values in ((ax.xaxis, batch), (ax.yaxis, per_token)):
        axis.set_major_formatter(plain)
        few = min(values) > 0 and max(values) < 100 * min(values)
        axis.set_minor_formatter(plain if few else NullFormatter())
    ax.set_xlabel("mean batch size (requests per engine step)")
    ax.set_ylabel("energy per output token (J)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="best")
    files = ", ".join(os.path.basename(os.fspath(p)) for p in paths[:3])
    if len(paths) > 3:
        files = f"{len(paths)} logs"
    ax.set_title(
        title or f"Energy per output token against batch size: {files} ({len(usable)} requests)"
    )
    return _save(fig, output)


# ---------------------------------------------------------------------------------------------
# Command line.


def main(argv: list[str] | None = None) -> int:
    """`python -m zeus.analyze COMMAND`.

    Commands: energy, avg-power, plot, plot-windows, plot-profile, plot-simulation, serving.
    """
    from zeus.util import cli

    def image_options(c: Any, default_size: str = "1200x600") -> None:
        c.add_argument("-o", "--output", required=True, help="image file (.png, .svg, .pdf)")
        c.add_argument("--size", default=default_size, help=f"pixels, WxH (default {default_size})")
        c.add_argument("--title", default=None, help="the figure's title")

    def gpu_names_option(c: Any) -> None:
        c.add_argument(
            "--gpu-names",
            default=None,
            help="model names by GPU index, comma-separated (default: this machine's)",
        )

    def size_of(text: str) -> tuple[int, int]:
        try:
            w, h = (int(x) for x in text.lower().split("x"))
            assert w > 0 and h > 0
        except (ValueError, AssertionError):
            raise cli.CliError(f"--size must be WxH in pixels, got {text!r}", "", 2) from None
        return w, h

    def names_of(text: str | None) -> dict[int, str] | None:
        return dict(enumerate(n.strip() for n in text.split(","))) if text else None

    def run(args: list[str]) -> int:
        p = cli.Parser(
            prog="python -m zeus.analyze",
            description="Energy, average power and plots of the logs zeus writes.",
        )
        sub = p.add_subparsers(dest="command", required=True)
        for name, what in (("energy", "energy in joules"), ("avg-power", "average power in W")):
            c = sub.add_parser(name, help=f"{what} of a power log (any log `plot` reads)")
            c.add_argument(
                "logfile",
                help="zeus-monitor CSV/JSONL, python -m zeus.monitor power output, a "
                "PowerMonitor dump or a ZeusMonitor log file",
            )
            c.add_argument("--start", type=float, default=None, help="seconds after the start")
            c.add_argument("--end", type=float, default=None, help="seconds after the start")
            c.add_argument(
                "--gpu", type=int, default=None, help="one GPU index (default: all, summed)"
            )
        pl = sub.add_parser("plot", help="power timelines of logs, into a PNG/SVG/PDF")
        pl.add_argument(
            "files",
            nargs="+",
            help="zeus-monitor CSV/JSONL, python -m zeus."
            "monitor power output, PowerMonitor dumps, ZeusMonitor log files",
        )
        image_options(pl)
        gpu_names_option(pl)
        pl.add_argument(
            "--window",
            action="append",
            default=None,
            metavar="NAME",
            help="of ZeusMonitor logs, only windows of this name (repeat for more)",
        )
        pw = sub.add_parser("plot-windows", help="energy per window of a ZeusMonitor log file")
        pw.add_argument("logfile", help="a ZeusMonitor(log_file=...) CSV")
        pw.add_argument(
            "--window",
            action="append",
            default=None,
            metavar="NAME",
            help="a window name to plot, a panel each (repeat; default: every name, up to 6)",
        )
        image_options(pw)
        gpu_names_option(pw)
        pp = sub.add_parser(
            "plot-profile", help="energy and time per power limit of an optimizer profile"
        )
        pp.add_argument("profile", help="a GlobalPowerLimitOptimizer profile_path JSON file")
        pp.add_argument(
            "--selector",
            choices=["zeus-cost", "energy", "time", "max-slowdown"],
            default="zeus-cost",
            help="how the chosen limit is picked (default zeus-cost, the optimizer's)",
        )
        pp.add_argument("--eta", type=float, default=0.5, help="zeus-cost's eta (default 0.5)")
        pp.add_argument(
            "--world-size", type=int, default=1, help="zeus-cost's GPU count (default 1)"
        )
        pp.add_argument(
            "--factor", type=float, default=1.1, help="max-slowdown's factor (default 1.1)"
        )
        pp.add_argument("--chosen", type=int, default=None, help="mark this limit (W) instead")
        image_options(pp)
        ps = sub.add_parser(
            "plot-simulation", help="energy and time per recurrence of zeus.simulate histories"
        )
        ps.add_argument("files", nargs="+", help="python -m zeus.simulate --output CSV files")
        ps.add_argument(
            "--label",
            action="append",
            default=None,
            help="legend entry of each file, in order (default: the file names)",
        )
        image_options(ps)
        sv = sub.add_parser(
            "serving",
            help="J per output token by batch size of EnergyLedger logs: a table, and a plot",
        )
        sv.add_argument("files", nargs="+", help="EnergyLedger(log_path=...) JSON-lines logs")
        sv.add_argument(
            "-o",
            "--output",
            "--out",
            default=None,
            help="also plot J/token against batch size into this image (.png, .svg, .pdf)",
        )
        sv.add_argument("--size", default="1200x600", help="pixels, WxH (default 1200x600)")
        sv.add_argument("--title", default=None, help="the figure's title")
        a = p.parse_args(args)
        if a.command in ("energy", "avg-power"):
            f = energy if a.command == "energy" else avg_power
            print(f(a.logfile, start=a.start, end=a.end, gpu=a.gpu))
            return 0
        if a.command == "serving":
            size = size_of(a.size)
            records = [r for path in a.files for r in read_ledger_log(path)]
            buckets = joules_per_token_by_batch(records)
            if not buckets:
                raise cli.CliError(
                    f"no finished request that generated tokens in {', '.join(a.files)} "
                    f"({len(records)} records)",
                    "give logs written by EnergyLedger(log_path=...) after requests finished",
                )
            print(format_batch_table(buckets))
            if a.output is not None:
                plot_serving(a.files, a.output, size, title=a.title)
                print(a.output)
            return 0
        size = size_of(a.size)
        if a.command == "plot":
            plot_power(
                a.files, a.output, names_of(a.gpu_names), size, title=a.title, windows=a.window
            )
        elif a.command == "plot-windows":
            plot_windows(a.logfile, a.output, a.window, names_of(a.gpu_names), size, title=a.title)
        elif a.command == "plot-profile":
            from zeus.optimizer.power_limit import (
                Energy,
                MaxSlowdownConstraint,
                Time,
                ZeusCost,
            )

            selectors: dict[str, Callable[[], OptimumSelector]] = {
                "zeus-cost": lambda: ZeusCost(eta_knob=a.eta, world_size=a.world_size),
                "energy": Energy,
                "time": Time,
                "max-slowdown": lambda: MaxSlowdownConstraint(factor=a.factor),
            }
            plot_profile(
                a.profile,
                a.output,
                selectors[a.selector](),
                a.chosen,
                size,
                title=a.title,
            )
        else:
            plot_simulation(a.files, a.output, a.label, size, title=a.title)
        print(a.output)
        return 0

    return cli.run("python -m zeus.analyze", run, argv, extra="plot")


if __name__ == "__main__":
    raise SystemExit(main())
