"""`python -m zeus.analyze plot`: power timelines from every log format zeus writes."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import zeus.device.sim
from zeus.analyze import plot_power, plot_profile, plot_simulation, plot_windows, read_power_log

pytest.importorskip("matplotlib")
REPO = Path(__file__).resolve().parents[1]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("ZEUS_", "CUDA_"))}
    e.update(ZEUS_GPU_BACKEND="sim", ZEUS_SIM_GPUS="H100,A40", ZEUS_SIM_LOAD="busy")
    e.update(ZEUS_SIM_FIDELITY="ideal", **extra)
    return e


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, Path]:
    """One log of each kind, written by the real tools on two simulated GPUs."""
    d = tmp_path_factory.mktemp("logs")
    out = {
        k: d / name
        for k, name in (
            ("zeus-monitor csv", "zm.csv"),
            ("zeus-monitor jsonl", "zm.jsonl"),
            ("monitor power csv", "pm.csv"),
            ("monitor power json", "pm.jsonl"),
            ("ZeusMonitor log", "windows.csv"),
            ("PowerMonitor dump", "timelines.json"),
        )
    }
    binary = REPO / "python" / "zeus" / "_bin" / "zeus-monitor"
    for key, fmt in (("zeus-monitor csv", "csv"), ("zeus-monitor jsonl", "jsonl")):
        subprocess.run(
            [
                str(binary),
                str(out[key]),
                "0.4",
                "0",
                "--interval",
                "20",
                "--gpus",
                "0,1",
                "--format",
                fmt,
            ],
            env=env(),
            check=True,
            capture_output=True,
        )
    for key, fmt in (("monitor power csv", "csv"), ("monitor power json", "json")):
        with open(out[key], "w") as f:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "zeus.monitor",
                    "power",
                    "--duration",
                    "0.4",
                    "--update-period",
                    "0.02",
                    "--format",
                    fmt,
                ],
                env=env(),
                check=True,
                stdout=f,
                stderr=subprocess.DEVNULL,
            )
    code = (
        "import time, warnings, zeus.device.sim\n"
        "warnings.simplefilter('ignore')\n"
        "from zeus.monitor import ZeusMonitor\n"
        f"m = ZeusMonitor(log_file={str(out['ZeusMonitor log'])!r})\n"
        "for k in range(3):\n"
        "    zeus.device.sim.set_busy(0, k % 2 == 0)\n"
        "    m.begin_window(f'w{k}', sync_cuda=False); time.sleep(0.1)\n"
        "    m.end_window(f'w{k}', sync_cuda=False)\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env(), check=True)
    dump = (
        "import json, time\n"
        "from zeus.monitor import PowerMonitor\n"
        "with PowerMonitor(update_period=0.02) as pm:\n"
        "    time.sleep(0.3)\n"
        f"json.dump(pm.get_all_power_timelines(), open({str(out['PowerMonitor dump'])!r}, 'w'))\n"
    )
    subprocess.run([sys.executable, "-c", dump], env=env(), check=True)
    return out


@pytest.mark.parametrize(
    "kind",
    [
        "zeus-monitor csv",
        "zeus-monitor jsonl",
        "monitor power csv",
        "monitor power json",
        "ZeusMonitor log",
        "PowerMonitor dump",
    ],
)
def test_each_format_plots_one_line_per_gpu(logs, kind, tmp_path, sim_gpus):
    sim_gpus("H100,A40")  # the legend's model names come from the GPUs visible here
    series = read_power_log(logs[kind])
    assert sorted(series.watts) == [0, 1]
    assert all(len(w) == len(series.times) > 3 for w in series.watts.values())
    h100 = series.watts[0]
    assert max(h100) > 500 and (kind == "ZeusMonitor log") == series.steps
    png = tmp_path / "out.png"
    fig = plot_power([logs[kind]], png, size=(900, 450))
    assert png_size(png) == (900, 450)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 2
    labels = [ln.get_label() for ln in lines]
    assert labels == ["GPU0 (NVIDIA H100 80GB HBM3 (Simulated))", "GPU1 (NVIDIA A40 (Simulated))"]
    ax = fig.axes[0]
    assert ax.get_title() == f"GPU power: {logs[kind].name}"
    assert ax.get_xlabel().startswith("time (s) since 20") and ax.get_xlabel().endswith(" UTC")
    assert ax.get_ylabel() == "power (W)"
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= max(h100)


def test_both_power_loggers_write_one_schema(logs):
    """`zeus-monitor` and `python -m zeus.monitor power` write the same header and keys."""
    headers = {
        k: logs[k].read_text().splitlines()[0] for k in ("zeus-monitor csv", "monitor power csv")
    }
    assert set(headers.values()) == {"Time,Power0,Power1"}
    for kind in ("zeus-monitor jsonl", "monitor power json"):
        row = json.loads(logs[kind].read_text().splitlines()[0])
        assert set(row) == {"time", "unix_time", "power_mw"}, kind
        assert set(row["power_mw"]) == {"0", "1"} and all(
            isinstance(mw, int) for mw in row["power_mw"].values()
        )


def test_the_command_line_plots_several_files(logs, tmp_path):
    out = tmp_path / "all.svg"
    files = [str(logs["zeus-monitor csv"]), str(logs["monitor power json"])]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "zeus.analyze",
            "plot",
            *files,
            "-o",
            str(out),
            "--gpu-names",
            "H100,A40",
        ],
        env=env(ZEUS_NVML_LIB="/nonexistent"),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    svg = out.read_text()
    assert svg.count("zm.csv: GPU") >= 2 and "pm.jsonl: GPU1 (A40)" in svg
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    r = subprocess.run(
        [sys.executable, "-m", "zeus.analyze", "plot", str(bad), "-o", str(tmp_path / "x.png")],
        env=env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "is not a power log zeus writes" in r.stderr
    assert "Traceback" not in r.stderr


def legend_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def figure_legend(fig) -> list[str]:
    """The one legend of a figure whose panels share it; no panel has its own."""
    [legend] = fig.legends
    assert all(ax.get_legend() is None for ax in fig.axes)
    return [t.get_text() for t in legend.get_texts()]


def test_a_flat_one_gpu_log_is_flat_from_zero_with_its_model(tmp_path, sim_gpus):
    """202 W all along: the axis starts at zero, and the `Time,Power` log gets its model."""
    log = tmp_path / "flat.csv"
    rows = [f"2023-11-14 22:13:{20 + k // 10:02d}.{k % 10}00000000,202000" for k in range(40)]
    log.write_text("Time,Power\n" + "\n".join(rows) + "\n")
    png = tmp_path / "flat.png"
    fig = plot_power([log], png, {0: "NVIDIA A40"}, size=(900, 450))
    assert png_size(png) == (900, 450)
    ax = fig.axes[0]
    [line] = ax.get_lines()
    assert set(line.get_ydata()) == {202.0}
    assert legend_labels(ax) == ["GPU (NVIDIA A40)"]
    low, high = ax.get_ylim()
    assert low == 0 and 202 < high < 250, (low, high)
    assert ax.get_title() == "GPU power: flat.csv"
    assert ax.get_xlabel() == "time (s) since 2023-11-14 22:13:20 UTC"
    assert ax.get_ylabel() == "power (W)"
    # Without names, the one GPU visible here names it; with two, the log cannot say which.
    sim_gpus("A40")
    fig = plot_power([log], tmp_path / "a.png")
    assert legend_labels(fig.axes[0]) == ["GPU (NVIDIA A40 (Simulated))"]
    sim_gpus("H100,A40")
    fig = plot_power([log], tmp_path / "b.png")
    assert legend_labels(fig.axes[0]) == ["GPU"]


def test_the_command_line_names_the_model_of_a_single_file(logs, tmp_path):
    out = tmp_path / "one.svg"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "zeus.analyze",
            "plot",
            str(logs["zeus-monitor csv"]),
            "-o",
            str(out),
            "--gpu-names",
            "H100,A40",
            "--title",
            "Two GPUs",
        ],
        env=env(ZEUS_NVML_LIB="/nonexistent"),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    svg = out.read_text()
    assert "GPU0 (H100)" in svg and "GPU1 (A40)" in svg and "Two GPUs" in svg


def nested_windows_log(path, epochs: int = 3, steps: int = 4) -> list[tuple[str, float, float]]:
    """A ZeusMonitor log of `steps` windows inside each of `epochs` windows on two GPUs.

    Returns `(name, gpu0 J, gpu1 J)` per window, as measured.
    """
    from zeus.monitor import ZeusMonitor

    monitor = ZeusMonitor(log_file=path)
    measured = []
    for _ in range(epochs):
        monitor.begin_window("epoch", sync_cuda=False)
        for step in range(steps):
            monitor.begin_window("step", sync_cuda=False)
            zeus.device.sim.run(0.2 * (1 + step))  # steps of growing length
            m = monitor.end_window("step", sync_cuda=False)
            measured.append(("step", m.gpu_energy[0], m.gpu_energy[1]))
            zeus.device.sim.advance(0.3)  # idle between steps
        m = monitor.end_window("epoch", sync_cuda=False)
        measured.append(("epoch", m.gpu_energy[0], m.gpu_energy[1]))
    return measured


def test_windows_plot_one_panel_per_window_name(tmp_path, sim_gpus):
    sim_gpus("A40,V100", clock="virtual")
    log = tmp_path / "train.csv"
    measured = nested_windows_log(log)
    png = tmp_path / "windows.png"
    fig = plot_windows(log, png, size=(900, 450))
    assert png_size(png) == (900, 450)
    assert fig._suptitle.get_text() == "Energy per window: train.csv"
    step_ax, epoch_ax = fig.axes
    assert step_ax.get_title().startswith("window 'step': 12 windows")
    assert epoch_ax.get_title().startswith("window 'epoch': 3 windows")
    assert figure_legend(fig) == [
        "GPU0 (NVIDIA A40 (Simulated))",
        "GPU1 (Tesla V100-PCIE-32GB (Simulated))",
    ]
    for ax, name in ((step_ax, "step"), (epoch_ax, "epoch")):
        assert ax.get_ylabel() == "energy (J)" and ax.get_ylim()[0] == 0
        gpu0, gpu1 = ax.get_lines()
        expected = [(e0, e1) for n, e0, e1 in measured if n == name]
        assert list(gpu0.get_ydata()) == pytest.approx([e for e, _ in expected], rel=1e-9)
        assert list(gpu1.get_ydata()) == pytest.approx([e for _, e in expected], rel=1e-9)
        # Each line is of one name only: its points go forward in time.
        assert list(gpu0.get_xdata()) == sorted(gpu0.get_xdata())
    # The four steps of an epoch grow, and the epochs hold more than any step.
    steps = step_ax.get_lines()[0].get_ydata()
    assert all(steps[k] < steps[k + 1] for k in (0, 1, 2))
    assert min(epoch_ax.get_lines()[0].get_ydata()) > max(steps)
    assert epoch_ax.get_xlabel().startswith("window start (s)") and step_ax.get_xlabel() == ""

    # The power timeline of such a log uses the innermost windows: it never runs back in time.
    series = read_power_log(log)
    assert len(series.times) == 2 * 12 and series.times == sorted(series.times)

    fig = plot_windows(log, tmp_path / "epochs.png", names=["epoch"])
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["window 'epoch'"]
    with pytest.raises(ValueError, match="no window named 'batch'; its windows: step, epoch"):
        plot_windows(log, tmp_path / "x.png", names=["batch"])


def test_windows_plot_asks_to_choose_among_many_names(tmp_path):
    log = tmp_path / "many.csv"
    rows = [f"{k},w{k},1.0,{10 * k}" for k in range(8)]
    log.write_text("start_time,window_name,elapsed_time,gpu0_energy\n" + "\n".join(rows) + "\n")
    with pytest.raises(ValueError, match="has 8 window names .*choose up to 6"):
        plot_windows(log, tmp_path / "x.png")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "zeus.analyze",
            "plot-windows",
            str(log),
            "-o",
            str(tmp_path / "two.png"),
            "--window",
            "w7",
            "--window",
            "w2",
            "--gpu-names",
            "A40",
        ],
        env=env(ZEUS_NVML_LIB="/nonexistent"),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert png_size(tmp_path / "two.png") == (1200, 600)


def test_profile_plot_marks_the_limit_the_optimizer_chose(tmp_path, sim_gpus, monkeypatch):
    from zeus.device import settings
    from zeus.monitor import ZeusMonitor
    from zeus.optimizer.power_limit import Done, GlobalPowerLimitOptimizer

    monkeypatch.setenv("ZEUS_STATE_DIR", str(tmp_path / "state"))
    sim_gpus("A40", clock="virtual")
    profile = tmp_path / "profile.json"
    try:
        with GlobalPowerLimitOptimizer(
            ZeusMonitor(gpu_indices=[0]),
            warmup_steps=1,
            profile_steps=4,
            pl_step=50,
            profile_path=profile,
        ) as plo:
            for _ in range(200):
                plo.on_step_begin()
                zeus.device.sim.run(0.25)
                plo.on_step_end()
                if isinstance(plo.state, Done):
                    break
            assert isinstance(plo.state, Done)
            chosen = plo.state.optimal_power_limit // 1000
            measured = {m.power_limit: m for m in plo.measurements}
    finally:
        settings.restore_all()
    png = tmp_path / "profile.png"
    fig = plot_profile(profile, png, size=(900, 450))
    assert png_size(png) == (900, 450)
    energy_ax, time_ax = fig.axes
    limits = sorted(measured)
    assert limits == [100, 150, 200, 250, 300]
    title = fig._suptitle.get_text()
    assert title.startswith(f"Power-limit profile profile.json: chosen {chosen} W (ZeusCost(")
    for ax, what, unit in ((energy_ax, "energy", "J"), (time_ax, "time", "s")):
        assert ax.get_ylabel() == f"{what} ({unit})" and ax.get_ylim()[0] == 0
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        curve, star = lines[what], lines[f"chosen: {chosen} W"]
        assert list(curve.get_xdata()) == limits
        values = [getattr(measured[w], what) for w in limits]
        assert list(curve.get_ydata()) == pytest.approx(values)
        assert list(star.get_xdata()) == [chosen]
        assert list(star.get_ydata()) == pytest.approx([getattr(measured[chosen], what)])
        # The dashed line across the panel at the chosen limit.
        assert any(
            list(ln.get_xdata()) == [chosen, chosen] and ln.get_linestyle() == "--"
            for ln in ax.get_lines()
        )
        assert legend_labels(ax) == [what, f"chosen: {chosen} W"]
    assert time_ax.get_xlabel() == "power limit (W)"
    # Another selector marks its own choice; a limit that was not profiled is refused.
    least = min(measured, key=lambda w: measured[w].energy)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "zeus.analyze",
            "plot-profile",
            str(profile),
            "-o",
            str(tmp_path / "energy.svg"),
            "--selector",
            "energy",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert f"chosen: {least} W" in (tmp_path / "energy.svg").read_text()
    r = subprocess.run(
        [sys.executable, "-m", "zeus.analyze", "plot-profile", str(profile), "-o", "x.png"]
        + ["--chosen", "120"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "120 W is not among the profiled ones" in r.stderr


def test_simulation_plot_energy_and_time_per_recurrence(tmp_path):
    totals = {}
    for policy in ("zeus", "default"):
        r = subprocess.run(
            [sys.executable, "-m", "zeus.simulate", "--gpu", "a40", "--workload", "cifar100"]
            + ["--policy", policy, "--seed", "1", "--output", str(tmp_path / f"{policy}.csv")],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        totals[policy] = json.loads(r.stdout)
    png = tmp_path / "sim.png"
    fig = plot_simulation(
        [tmp_path / "zeus.csv", tmp_path / "default.csv"],
        png,
        labels=["Zeus", "baseline"],
        size=(900, 450),
    )
    assert png_size(png) == (900, 450)
    assert fig._suptitle.get_text() == "Trace simulation: energy and time per recurrence"
    energy_ax, time_ax = fig.axes
    # cifar100 on the A40: tens of kJ per recurrence, hours of training.
    assert energy_ax.get_ylabel() == "energy (kJ)" and time_ax.get_ylabel() == "time (min)"
    assert time_ax.get_xlabel() == "recurrence"
    assert figure_legend(fig) == ["Zeus", "baseline"]
    for ax, key, scale in ((energy_ax, "energy", 1e3), (time_ax, "time", 60.0)):
        assert ax.get_ylim()[0] == 0
        for line, policy in zip(ax.get_lines(), ("zeus", "default")):
            n = totals[policy]["recurrences"]
            assert list(line.get_xdata()) == list(range(1, n + 1))
            assert sum(line.get_ydata()) * scale == pytest.approx(totals[policy][key], rel=1e-9)
    # The baseline costs the same every recurrence; Zeus explores, then settles below it.
    zeus_e, base_e = (ln.get_ydata() for ln in energy_ax.get_lines())
    assert len(set(base_e)) == 1 and zeus_e[-1] < base_e[0]


def test_the_readme_plots_exist_and_their_commands_too():
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Plots\n", 1)[1].split("\n## ", 1)[0]
    images = re.findall(r"!\[[^\]]*\]\((docs/img/[^)]+\.png)\)", section)
    assert len(images) == 4
    for image in images:
        assert png_size(REPO / image) == (900, 450), image
    help_text = subprocess.run(
        [sys.executable, "-m", "zeus.analyze", "--help"], capture_output=True, text=True
    ).stdout
    commands = re.findall(r"python -m zeus\.analyze ([a-z-]+)", section)
    assert set(commands) == {"plot", "plot-windows", "plot-profile", "plot-simulation", "energy"}
    assert all(c in help_text for c in commands)


@pytest.mark.parametrize(
    ("command", "content", "needle"),
    [
        ("plot-windows", "Time,Power\n", "is not a ZeusMonitor log file"),
        ("plot-profile", '{"power_limit": 300}', "is not a power limit profile"),
        (
            "plot-profile",
            '{"measurements": [{"power_limit": 300, "energy": -1, "time": 1}]}',
            "is not a power limit profile",
        ),
        ("plot-simulation", "rec,energy\n1,2\n", "is not a python -m zeus.simulate history"),
        ("plot-simulation", "rec,try,batch_size,power_limit,energy,time,reached\n", "holds no run"),
    ],
)
def test_new_plots_say_what_is_wrong_with_a_file(tmp_path, command, content, needle):
    bad = tmp_path / "bad.txt"
    bad.write_text(content)
    r = subprocess.run(
        [sys.executable, "-m", "zeus.analyze", command, str(bad), "-o", str(tmp_path / "x.png")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "x.png").exists()
