"""Analyse power logs written by `zeus-monitor` (the reference's `zeus.analyze`), and plot them.

`energy` and `avg_power` read the reference's log: a CSV with a `Time` column
(`2022-07-13 02:07:36.708783111`) and a `Power` column in milliwatts, as
`zeus-monitor LOGFILE DURATION SLEEP_MS` writes it (only numpy is needed). `read_power_log` and
`plot_power` take every power log zeus writes; plotting needs matplotlib (the `plot` extra).
`python -m zeus.analyze energy|avg-power|plot` is the command line.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zeus.optimizer.recurring.job import (
    HistoryEntry,
)  # the reference defined it here; one class serves both

__all__ = ["HistoryEntry", "PowerSeries", "avg_power", "energy", "plot_power", "read_power_log"]


def _read(logfile: str | os.PathLike[str], drop_last: bool) -> tuple[np.ndarray, np.ndarray]:
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


def _window(
    times: np.ndarray,
    start: float | None,
    end: float | None,
    negative_from_end: bool,
) -> np.ndarray:
    """Mask of rows within `[start, end]` seconds of the first row.

    Negative bounds count back from the last row when `negative_from_end`.
    """
    mask = np.ones(len(times), dtype=bool)
    if len(times) == 0:
        return mask
    first, last = times[0], times[-1]

    def bound(offset: float) -> np.datetime64:
        origin = last if (negative_from_end and offset < 0) else first
        return origin + np.timedelta64(int(round(offset * 1e9)), "ns")

    if start is not None:
        mask &= times >= bound(start)
    if end is not None:
        mask &= times <= bound(end)
    return mask


def _seconds(times: np.ndarray) -> np.ndarray:
    return (times - times[0]).astype("timedelta64[ns]").astype(np.int64) / 1e9


def _area(logfile: str | os.PathLike[str], seconds: np.ndarray, power_w: np.ndarray) -> float:
    if len(seconds) < 2:
        raise ValueError(
            f"At least 2 points are needed to compute area under curve, but {len(seconds)} "
            f"remain in {os.fspath(logfile)!r} after selecting the window"
        )
    return float(np.sum(np.diff(seconds) * (power_w[1:] + power_w[:-1]) / 2.0))


def energy(
    logfile: str | os.PathLike[str],
    start: float | None = None,
    end: float | None = None,
    *,
    drop_last: bool = True,
) -> float:
    """Energy in joules logged in `logfile` (trapezoidal rule over power).

    Args:
        logfile: A `zeus-monitor` CSV (`Time`, `Power` in mW).
        start: Seconds after the first row to start at; negative counts back from the last row.
        end: Seconds after the first row to end at; negative counts back from the last row.
        drop_last: Ignore the last row, as the reference does (it may be partial).

    Raises:
        ValueError: Fewer than two rows remain, or the file is not such a log.

    """
    times, power_w = _read(logfile, drop_last)
    mask = _window(times, start, end, negative_from_end=True)
    times, power_w = times[mask], power_w[mask]
    return _area(logfile, _seconds(times) if len(times) else times, power_w)


def avg_power(
    logfile: str | os.PathLike[str],
    start: float | None = None,
    end: float | None = None,
    *,
    drop_last: bool = True,
) -> float:
    """Average power in watts logged in `logfile`: energy over the covered time span.

    Args:
        logfile: A `zeus-monitor` CSV (`Time`, `Power` in mW).
        start: Seconds after the first row to start at.
        end: Seconds after the first row to end at.
        drop_last: Ignore the last row, as the reference does (it may be partial).

    Raises:
        ValueError: Fewer than two rows remain, or the file is not such a log.

    """
    times, power_w = _read(logfile, drop_last)
    mask = _window(times, start, end, negative_from_end=False)
    times, power_w = times[mask], power_w[mask]
    seconds = _seconds(times) if len(times) else np.zeros(0)
    area = _area(logfile, seconds, power_w)
    return area / float(seconds.max() - seconds.min())


@dataclass
class PowerSeries:
    """Power of some GPUs over time, read from a log by `read_power_log`.

    Attributes:
        times: Seconds (Unix time where the log has it), one per sample.
        watts: GPU index (or `None` where the log does not say which GPU) to watts per sample.
        steps: Whether each sample holds until the next one (a `ZeusMonitor` log's windows:
            average power over each window) rather than being a point reading.

    """

    times: list[float]
    watts: dict[int | None, list[float]] = field(default_factory=dict)
    steps: bool = False


def _seconds_of(stamp: str) -> float:
    return float(np.datetime64(stamp.strip(), "ns").astype(np.int64)) / 1e9


def _gpu_of(column: str, prefix: str, suffix: str) -> int | None:
    middle = column[len(prefix) : len(column) - len(suffix)]
    return int(middle) if middle.isdigit() else None


def read_power_log(path: str | os.PathLike[str]) -> PowerSeries:
    """Read any power log zeus writes, by its content.

    - the power log of `zeus-monitor` and `python -m zeus.monitor power`: CSV (`Time,Power` or
      `Time,Power0,Power1,...`, mW) and JSON lines (`{"time", "unix_time", "power_mw"}`);
    - a `PowerMonitor` timeline dump: `json.dump(pm.get_all_power_timelines(), f)` (its first
      domain is plotted) or `json.dump(pm.get_power_timeline(), f)`;
    - a `ZeusMonitor` log file (`start_time,window_name,elapsed_time,gpu0_energy,...`), as the
      average power of each window.

    Raises:
        ValueError: the file is none of these, naming it and what it found.

    """
    name = os.fspath(path)
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
            series = PowerSeries(times=[float(t) for t, _ in dump[gpus[0]]])
            for g in gpus:
                series.watts[int(g)] = [float(w) for _, w in dump[g]]
            return series
    if first.lstrip().startswith("{"):
        series = PowerSeries(times=[])
        for line in [first, *rest.splitlines()]:
            if not line.strip():
                continue
            row = json.loads(line)
            if "power_mw" not in row:
                raise ValueError(f"{name!r}: a JSON line without power: {line.strip()[:80]}")
            series.times.append(float(row["unix_time"]))
            for gpu, mw in row["power_mw"].items():
                series.watts.setdefault(int(gpu), []).append(float(mw) / 1000.0)
        return series
    rows = list(csv.reader([first, *rest.splitlines()]))
    header = [h.strip() for h in rows[0]]
    body = [r for r in rows[1:] if r and len(r) == len(header)]
    if header[:3] == ["start_time", "window_name", "elapsed_time"]:
        series = PowerSeries(times=[], steps=True)
        # GPU energy columns only (not CPU/DRAM, nor the `_uncertainty` bounds).
        columns = [
            (k, gpu)
            for k, h in enumerate(header)
            if k >= 3 and (gpu := _gpu_of(h, "gpu", "_energy")) is not None
        ]
        for r in sorted(body, key=lambda r: float(r[0])):
            start, elapsed = float(r[0]), float(r[2])
            if elapsed <= 0:
                continue
            series.times += [start, start + elapsed]
            for k, gpu in columns:
                w = float(r[k]) / elapsed
                series.watts.setdefault(gpu, []).extend([w, w])
        return series
    if header and header[0] == "Time":  # the power log's CSV, mW
        power_columns = [
            (k, _gpu_of(h, "Power", "")) for k, h in enumerate(header) if h.startswith("Power")
        ]
        series = PowerSeries(times=[_seconds_of(r[0]) for r in body])
        for k, gpu in power_columns:
            series.watts[gpu] = [float(r[k]) / 1000.0 for r in body]
        return series
    raise ValueError(
        f"{name!r} is not a power log zeus writes (header {header[:4]}); expected a zeus-monitor "
        "or python -m zeus.monitor power CSV or JSON lines, or a ZeusMonitor log file"
    )


def plot_power(
    paths: list[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    gpu_names: dict[int, str] | None = None,
    size: tuple[int, int] = (1200, 600),
) -> Any:
    """Plot the power timelines of `paths` into `output` (PNG, SVG, PDF: by its extension).

    One line per GPU per file; the legend names each GPU's model from `gpu_names`, else from
    the GPUs visible here (`zeus.device`), else by index only. Needs matplotlib (the `plot`
    extra). Returns the matplotlib figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = dict(gpu_names or {})
    if not names:
        try:
            from zeus.device import get_gpus

            gpus = get_gpus()
            names = {i: gpus.get_name(i) for i in range(len(gpus))}
        except Exception:
            names = {}
    dpi = 100
    fig, ax = plt.subplots(figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi)
    series = [(os.fspath(p), read_power_log(p)) for p in paths]
    origin = min((s.times[0] for _, s in series if s.times), default=0.0)
    for path, s in series:
        t = [x - origin for x in s.times]
        for gpu, watts in s.watts.items():
            label = "GPU" if gpu is None else f"GPU{gpu}"
            if gpu is not None and gpu in names:
                label += f" ({names[gpu]})"
            if len(series) > 1:
                label = f"{os.path.basename(path)}: {label}"
            ax.plot(t, watts, label=label, drawstyle="steps-post" if s.steps else "default")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("power (W)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(output, dpi=dpi)
    plt.close(fig)
    return fig


def main(argv: list[str] | None = None) -> int:
    """`python -m zeus.analyze energy|avg-power|plot ...`."""
    from zeus.util import cli

    def run(args: list[str]) -> int:
        p = cli.Parser(
            prog="python -m zeus.analyze",
            description="Energy, average power and plots of the power logs zeus writes.",
        )
        sub = p.add_subparsers(dest="command", required=True)
        for name, what in (("energy", "energy in joules"), ("avg-power", "average power in W")):
            c = sub.add_parser(name, help=f"{what} of a zeus-monitor CSV")
            c.add_argument("logfile", help="a zeus-monitor CSV (Time,Power)")
            c.add_argument("--start", type=float, default=None, help="seconds after the start")
            c.add_argument("--end", type=float, default=None, help="seconds after the start")
        pl = sub.add_parser("plot", help="power timelines of logs, into a PNG/SVG/PDF")
        pl.add_argument(
            "files",
            nargs="+",
            help="zeus-monitor CSV/JSONL, python -m zeus."
            "monitor power output, ZeusMonitor log files",
        )
        pl.add_argument("-o", "--output", required=True, help="image file (.png, .svg, .pdf)")
        pl.add_argument(
            "--gpu-names",
            default=None,
            help="model names by GPU index, comma-separated (default: this machine's)",
        )
        pl.add_argument("--size", default="1200x600", help="pixels, WxH (default 1200x600)")
        a = p.parse_args(args)
        if a.command == "plot":
            try:
                w, h = (int(x) for x in a.size.lower().split("x"))
                assert w > 0 and h > 0
            except (ValueError, AssertionError):
                raise cli.CliError(f"--size must be WxH in pixels, got {a.size!r}", "", 2) from None
            names = None
            if a.gpu_names:
                names = dict(enumerate(n.strip() for n in a.gpu_names.split(",")))
            plot_power(a.files, a.output, names, (w, h))
            print(a.output)
            return 0
        f = energy if a.command == "energy" else avg_power
        print(f(a.logfile, start=a.start, end=a.end))
        return 0

    return cli.run("python -m zeus.analyze", run, argv, extra="plot")


if __name__ == "__main__":
    raise SystemExit(main())
