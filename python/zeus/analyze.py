"""Analyse power logs written by `zeus-monitor` (the reference's `zeus.analyze`).

The log is a CSV with a `Time` column (`2022-07-13 02:07:36.708783111`) and a `Power` column
in milliwatts, as `zeus-monitor LOGFILE DURATION SLEEP_MS` writes it. Only numpy is needed.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from zeus.job import HistoryEntry  # the reference defined it here; one class serves both

__all__ = ["HistoryEntry", "avg_power", "energy"]


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


def main(argv: list[str] | None = None) -> int:
    """`python -m zeus.analyze energy|avg-power LOGFILE [--start S] [--end S]`."""
    from zeus.util import cli

    def run(args: list[str]) -> int:
        p = cli.Parser(
            prog="python -m zeus.analyze",
            description="Energy (J) or average power (W) of a zeus-monitor power log.",
        )
        sub = p.add_subparsers(dest="command", required=True)
        for name, what in (("energy", "energy in joules"), ("avg-power", "average power in W")):
            c = sub.add_parser(name, help=what)
            c.add_argument("logfile", help="a zeus-monitor CSV (Time,Power)")
            c.add_argument("--start", type=float, default=None, help="seconds after the start")
            c.add_argument("--end", type=float, default=None, help="seconds after the start")
        a = p.parse_args(args)
        f = energy if a.command == "energy" else avg_power
        print(f(a.logfile, start=a.start, end=a.end))
        return 0

    return cli.run("python -m zeus.analyze", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
