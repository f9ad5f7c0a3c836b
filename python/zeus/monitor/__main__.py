"""`python -m zeus.monitor energy|power|serve`: measure from the command line until Ctrl-C.

- `energy`: one measurement window over the whole run; prints time, energy per GPU and the
  total at the end.
- `power`: a `PowerMonitor`; shows live power per GPU and, at the end, the total time and
  energy integrated from the timeline.

`--format table` (default) is for people: a live view on a terminal and a table at the end.
`--format csv` and `--format json` are for programs: `energy` prints one row (CSV with a header)
or one JSON object; `power` streams one row or JSON line per sample as it is taken (the
power-log schema of `zeus-monitor`: `Time,Power0,...` in mW, or `{"time", "unix_time",
"power_mw"}`), and so does `table` when stdout is not a terminal (piped rows, not a live view).
Status lines and the closing summary of a stream go to stderr. Ctrl-C, SIGTERM or `--duration`
end the run.

- `stream`: live power of whole nodes from their zeusd daemons (`PowerStreamingClient`), one
  server per argument (`host[:port]` over TCP, or the path of a Unix socket): a live table on a
  terminal, else (or with `--format json`) one JSON line per `--interval`.

- `serve`: the Prometheus exporter. It runs the bundled `zeus-monitor serve` binary in place of
  this process (so Ctrl-C and SIGTERM reach it directly); see `zeus-monitor serve --help` for the
  metrics it exposes at `/metrics`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from typing import Any, Sequence, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from zeus.util import cli


def _parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="python -m zeus.monitor",
        description="Measure GPU energy or power until interrupted (Ctrl-C).",
    )
    sub = p.add_subparsers(dest="mode", required=True, metavar="{energy,power,stream,serve}")
    e = sub.add_parser("energy", help="Total time and energy of the whole run.")
    w = sub.add_parser("power", help="Power per GPU over time, and energy at the end.")
    for s in (e, w):
        s.add_argument(
            "--gpu-indices", type=int, nargs="+", default=None, help="GPUs (default: all)"
        )
        s.add_argument(
            "--format", choices=["table", "csv", "json"], default="table", help="output format"
        )
        s.add_argument(
            "--duration", type=cli.positive_float, default=None, help="stop after this many s"
        )
    w.add_argument(
        "--update-period",
        type=cli.positive_float,
        default=None,
        help="Seconds between samples (default: half the GPUs' power update period)",
    )
    t = sub.add_parser("stream", help="Live power of nodes from their zeusd daemons.")
    t.add_argument(
        "servers",
        nargs="+",
        type=_server,
        metavar="SERVER",
        help="a zeusd: host[:port] (TCP, port 4938 by default) or a Unix socket path",
    )
    t.add_argument("--format", choices=["table", "json"], default="table", help="output format")
    t.add_argument(
        "--interval", type=cli.positive_float, default=1.0, help="seconds between outputs"
    )
    t.add_argument(
        "--duration", type=cli.positive_float, default=None, help="stop after this many s"
    )
    s = sub.add_parser(
        "serve",
        help="Serve GPU and CPU energy and power to Prometheus (runs the bundled "
        "zeus-monitor serve).",
    )
    s.add_argument(
        "--listen",
        default=None,
        metavar="IP:PORT",
        help="address to listen on (default 127.0.0.1:9400; port 0 picks a free port)",
    )
    s.add_argument(
        "--gpus",
        default=None,
        metavar="INDICES",
        help="GPUs to export, comma-separated, e.g. 0,1 (default: all)",
    )
    s.add_argument(
        "--cpus",
        default=None,
        metavar="auto|all|none|INDICES",
        help="CPU packages to export from RAPL (default auto: all if RAPL is readable)",
    )
    return p


def _serve(args: argparse.Namespace) -> None:
    """Become `zeus-monitor serve` (the binary checks the values and names a bad one)."""
    from zeus._bin_launcher import _exec

    argv = ["serve"]
    if args.listen is not None:
        argv += ["--listen", args.listen]
    if args.gpus is not None:
        argv += ["--gpus", args.gpus]
    if args.cpus is not None:
        argv += ["--cpus", args.cpus]
    sys.stdout.flush()
    sys.stderr.flush()
    _exec("zeus-monitor", argv)


def _server(value: str) -> Any:
    """`argparse` type of a zeusd: a Unix socket path (has a `/`) or `host[:port]`."""
    from zeus.device.exception import ZeusdConfigError
    from zeus.device.zeusd import ZeusdConfig, parse_host_port

    if "/" in value:
        return ZeusdConfig.uds(value)
    try:
        host, port = parse_host_port(value, "SERVER")
    except ZeusdConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return ZeusdConfig.tcp(host, port)


def _stream(args: argparse.Namespace, out: TextIO, err: Console) -> None:
    from zeus.monitor.power_streaming import PowerStreamingClient

    client = PowerStreamingClient(args.servers)
    err.print(f"Streaming power from {', '.join(s.key for s in args.servers)}; Ctrl-C to stop.")
    live = args.format == "table" and out.isatty()
    end = _until(args.duration)
    try:
        with _live_view(out, live, 4) as view:
            while True:
                snapshot = client.get_power()
                if live:
                    view.update(_stream_table(snapshot, [s.key for s in args.servers]))
                else:
                    print(json.dumps(_stream_row(snapshot)), file=out, flush=True)
                if time.monotonic() + args.interval > end:
                    break
                time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    finally:
        client.stop()


def _stream_row(snapshot: dict[str, Any]) -> dict[str, Any]:
    """One JSON line of `stream`: power by server and device, and the total, W."""
    servers: dict[str, Any] = {}
    total = 0.0
    for key, r in snapshot.items():
        row: dict[str, Any] = {"timestamp_s": r.timestamp_s}
        row["gpu_w"] = {str(i): w for i, w in sorted(r.gpu_power_w.items())}
        row["cpu_w"] = {str(i): c.cpu_w for i, c in sorted(r.cpu_power_w.items())}
        row["dram_w"] = {
            str(i): c.dram_w for i, c in sorted(r.cpu_power_w.items()) if c.dram_w is not None
        }
        total += sum(row["gpu_w"].values()) + sum(row["cpu_w"].values())
        total += sum(row["dram_w"].values())
        servers[key] = row
    return {"time": time.time(), "servers": servers, "total_w": total}


def _stream_table(snapshot: dict[str, Any], keys: list[str]) -> Table:
    t = Table(title="zeus.monitor stream (Ctrl-C to stop)")
    for column in ("server", "device", "power (W)"):
        t.add_column(column, justify="right" if column == "power (W)" else "left")
    row = _stream_row(snapshot)
    for key in keys:
        if key not in row["servers"]:
            t.add_row(key, "(no connection)", "")
            continue
        for kind, watts in row["servers"][key].items():
            if kind != "timestamp_s":
                for i, w in watts.items():
                    t.add_row(key, f"{kind[:-2].upper()}{i}", f"{w:.1f}")
    t.add_row("total", "", f"{row['total_w']:.1f}")
    return t


def _sigterm_as_interrupt() -> None:
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _live_view(out: TextIO, live: bool, per_second: int) -> Any:
    """A rich live view on a terminal; nothing when `out` is a pipe or file."""
    if not live:
        return contextlib.nullcontext()
    return Live(console=Console(file=out), refresh_per_second=per_second, transient=True)


def _until(duration: float | None) -> float:
    return float("inf") if duration is None else time.monotonic() + duration


def _energy(args: argparse.Namespace, out: TextIO, err: Console) -> None:
    from zeus.monitor import ZeusMonitor

    monitor = ZeusMonitor(gpu_indices=args.gpu_indices)
    gpus = monitor.gpus
    assert gpus is not None, "a monitor with GPUs has them"
    start = gpus.now()
    monitor.begin_window("zeus.monitor.energy", sync_cuda=False)
    err.print(f"Measuring energy of GPUs {monitor.gpu_indices}; Ctrl-C to stop.")
    end = _until(args.duration)
    live = args.format == "table" and out.isatty()
    try:
        with _live_view(out, live, 4) as view:
            while time.monotonic() < end:
                if live:
                    rows = {"elapsed (s)": f"{gpus.now() - start:.1f}"}
                    for i in monitor.gpu_indices:
                        watts = gpus.get_power_usage(i) / 1000
                        rows[f"GPU{i} power (W)"] = f"{watts:.1f}"
                    view.update(_table("zeus.monitor energy (Ctrl-C to stop)", rows))
                time.sleep(min(0.25, max(0.0, end - time.monotonic())))
    except KeyboardInterrupt:
        pass
    m = monitor.end_window("zeus.monitor.energy", sync_cuda=False)
    energy = {i: m.energy[i] for i in monitor.gpu_indices}
    bound = {i: m.gpu_energy_uncertainty.get(i, 0.0) for i in monitor.gpu_indices}
    method = {i: m.gpu_energy_provenance[i].method for i in monitor.gpu_indices}
    total, total_bound = sum(energy.values()), sum(bound.values())
    if args.format == "json":
        print(
            json.dumps(
                {
                    "time_s": m.time,
                    "energy_j": {str(i): e for i, e in energy.items()},
                    "energy_uncertainty_j": {str(i): b for i, b in bound.items()},
                    "method": {str(i): x for i, x in method.items()},
                    "total_energy_j": total,
                    "total_energy_uncertainty_j": total_bound,
                }
            ),
            file=out,
        )
    elif args.format == "csv":
        header = ["time_s", *(f"gpu{i}_energy_j" for i in energy), "total_energy_j"]
        header += [f"gpu{i}_energy_uncertainty_j" for i in energy]
        print(",".join(header), file=out)
        values = (m.time, *energy.values(), total, *bound.values())
        print(",".join(repr(x) for x in values), file=out)
    else:
        t = Table(title=f"zeus.monitor energy: {m.time:.3f} s")
        t.add_column("GPU")
        t.add_column("energy (J)", justify="right")
        t.add_column("average power (W)", justify="right")
        t.add_column("how", justify="left")
        for i, e in energy.items():
            avg = e / m.time if m.time else 0.0
            t.add_row(str(i), f"{e:.3f} ± {bound[i]:.3f}", f"{avg:.1f}", method[i])
        avg = total / m.time if m.time else 0.0
        t.add_row("total", f"{total:.3f} ± {total_bound:.3f}", f"{avg:.1f}", "")
        Console(file=out).print(t)
        err.print(
            "± is the bound within which the true energy lies in about 95% of windows "
            "(docs/measurement-uncertainty.md)."
        )


def _table(title: str, rows: dict[str, str]) -> Table:
    t = Table(title=title)
    t.add_column("")
    t.add_column("value", justify="right")
    for k, v in rows.items():
        t.add_row(k, v)
    return t


class _Rows:
    """Streams new samples of a `PowerMonitor` into `out`, in `zeus-monitor`'s power log.

    The schema is `zeus._core.monitor.PowerLog`'s: CSV, or JSON lines with `fmt="json"`.
    """

    def __init__(self, out: TextIO, fmt: str, indices: list[int]) -> None:
        from zeus import _core

        self.out, self.indices = out, indices
        self.log = _core.monitor.PowerLog("jsonl" if fmt == "json" else "csv", indices)
        self.last = float("-inf")
        if self.log.header is not None:
            print(self.log.header, file=out, flush=True)

    def emit(self, pm: object) -> None:
        timelines = pm.get_power_timeline(start_time=self.last)  # type: ignore[attr-defined]
        columns = [timelines[i] for i in self.indices]
        for k in range(len(columns[0])):
            t = columns[0][k][0]
            if t <= self.last:
                continue
            milliwatts = [round(c[k][1] * 1000) for c in columns]
            print(self.log.row(t, milliwatts), file=self.out)
            self.last = t
        self.out.flush()


def _power(args: argparse.Namespace, out: TextIO, err: Console) -> None:
    from zeus.device import get_gpus
    from zeus.monitor import PowerMonitor

    gpus = get_gpus()
    monitor = PowerMonitor(gpu_indices=args.gpu_indices, update_period=args.update_period)
    start = gpus.now()
    refresh = max(monitor.update_period, 0.1)
    err.print(
        f"Sampling power of GPUs {monitor.gpu_indices} every {monitor.update_period:g} s; "
        "Ctrl-C to stop."
    )
    live = args.format == "table" and out.isatty()
    rows = None if live else _Rows(out, args.format, monitor.gpu_indices)
    end = _until(args.duration)
    try:
        with _live_view(out, live, 10) as view:
            while time.monotonic() < end:
                if not monitor.running:
                    monitor.sample_now()  # virtual clock: sampling is ours to drive
                if rows is not None:
                    rows.emit(monitor)
                else:
                    power = monitor.get_power() or {}
                    cells = {f"GPU{i} (W)": f"{w:.1f}" for i, w in power.items()}
                    title = f"zeus.monitor power, every {monitor.update_period:g} s"
                    view.update(_table(title, cells))
                time.sleep(min(refresh, max(0.0, end - time.monotonic())))
    except KeyboardInterrupt:
        pass
    stop = gpus.now()
    monitor.sample_now()
    monitor.stop()
    if rows is not None:
        rows.emit(monitor)
    energy = monitor.get_energy(start, stop) or {}
    summary = Console(file=out) if live else err
    summary.print(f"Total time (s): {stop - start:.3f}")
    summary.print("Total energy (J): " + repr({f"GPU{i}": round(e, 3) for i, e in energy.items()}))
    summary.print(f"Samples: {monitor.num_samples} at {monitor.update_period:g} s")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (expected errors: one line and a hint)."""
    return cli.run("python -m zeus.monitor", _main, argv)


def _main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.mode == "serve":
        _serve(args)  # does not return
    _sigterm_as_interrupt()
    err = Console(stderr=True)
    if args.mode == "energy":
        _energy(args, sys.stdout, err)
    elif args.mode == "stream":
        _stream(args, sys.stdout, err)
    else:
        _power(args, sys.stdout, err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
