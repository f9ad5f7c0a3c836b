"""ZeusMaster + JobSession (+ ZeusDataLoader when torch is importable) on the simulated GPU."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

import pytest
import zeus.device.sim
from zeus.job import Job
from zeus.policy import PruningGTSBatchSizeOptimizer
from zeus.run import JobSession, ZeusMaster
from zeus.run.session import compute_optimal_pl, power_limit_steps
from zeus.util.metric import ZeusCostThresholdExceededError

SCRIPT = Path(__file__).with_name("sim_train.py")


@pytest.fixture
def a40(sim_gpus, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    gpus = sim_gpus("A40", clock="virtual")
    monkeypatch.setenv("ZEUS_TARGET_METRIC", "0.5")
    monkeypatch.setenv("ZEUS_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("ZEUS_PROFILE_PARAMS", "2,4")
    return gpus


def train(session: JobSession, bs: int, reach_at: int | None, eval_iters: int = 4) -> list[int]:
    """The loop of sim_train.py, in process."""
    seen = []
    for epoch in session.epochs():
        seen.append(epoch)
        session.begin_epoch("train")
        for _ in range(session.train_iters):
            session.before_train_iteration()
            zeus.device.sim.run(bs / 1024, [0])
        session.end_epoch("train")
        session.begin_epoch("eval")
        for _ in range(eval_iters):
            zeus.device.sim.run(0.05, [0])
        session.end_epoch("eval")
        session.report_metric(float(reach_at is not None and epoch + 1 >= reach_at), True)
    return seen


def expected_optimal_pl(eta: float = 0.5) -> int:
    """Optimum of the simulated A40's workload curve in W (cost per unit of work)."""
    pts = zeus.device.sim.workload_points(0)
    max_w = max(p for p, _, _ in pts)
    return int(min(pts, key=lambda x: (eta * x[2] + (1 - eta) * max_w) * x[1])[0])


def test_session_profiles_every_limit_and_picks_the_optimum(a40, tmp_path: Path) -> None:
    s = JobSession(64, max_epochs=5, train_iters=64, eval_iters=4)
    assert s.profiling
    assert train(s, 64, reach_at=3) == [0, 1, 2]
    power = json.loads((tmp_path / "logs" / "bs64.power.json").read_text())
    assert sorted(int(k) for k in power["train_power"]) == list(range(100_000, 300_001, 25_000))
    assert power["optimal_pl"] == expected_optimal_pl() * 1000
    # Units fixed (§5.4): with max power in mW the optimum would be the fastest limit.
    assert power["optimal_pl"] != 300_000
    assert a40.get_power_management_limit(0) == power["optimal_pl"]
    result = json.loads((tmp_path / "logs" / "zeus+bs64.train.json").read_text())
    assert result["reached"] is True and result["num_epochs"] == 3
    assert result["energy"] > 0 and result["time"] > 0
    # Second run of the same batch size: no profiling, straight to the optimum.
    s2 = JobSession(64, max_epochs=5, train_iters=64, eval_iters=4)
    assert not s2.profiling and s2.optimal_pl == power["optimal_pl"]


def test_profiling_spans_epochs_when_they_are_short(a40, tmp_path: Path) -> None:
    # 16 iterations per epoch, 7 per limit: 2 limits per epoch, 9 limits -> 5 epochs.
    s = JobSession(256, max_epochs=8, train_iters=16, eval_iters=4)
    train(s, 256, reach_at=8)
    power = json.loads((tmp_path / "logs" / "bs256.power.json").read_text())
    assert len(power["train_power"]) == 9
    assert len(power["eval_power"]) >= 2  # eval epochs at intermediate limits, then the optimum
    assert str(power["optimal_pl"]) in power["eval_power"]


def test_cost_threshold_stops_before_crossing(a40, tmp_path: Path, monkeypatch) -> None:
    train(JobSession(64, max_epochs=10, train_iters=64, eval_iters=4), 64, reach_at=2)
    first = json.loads((tmp_path / "logs" / "zeus+bs64.train.json").read_text())
    per_epoch = first["cost"] / 2
    monkeypatch.setenv("ZEUS_JOB_ID", "capped")
    monkeypatch.setenv("ZEUS_COST_THRESH", str(3.5 * per_epoch))
    s = JobSession(64, max_epochs=10, train_iters=64, eval_iters=4)
    with pytest.raises(ZeusCostThresholdExceededError) as e:
        train(s, 64, reach_at=None)
    capped = json.loads((tmp_path / "logs" / "capped+bs64.train.json").read_text())
    assert capped["reached"] is False
    assert capped["num_epochs"] == 3
    assert capped["cost"] < e.value.cost_thresh <= e.value.next_cost
    assert e.value.cost == pytest.approx(capped["cost"])


def test_data_parallel_ranks_stop_together(a40, monkeypatch) -> None:
    monkeypatch.setenv("ZEUS_COST_THRESH", "0")
    decisions: list[bool] = []

    def decide(stop: bool) -> bool:
        decisions.append(stop)
        return True  # rank 0 said stop

    s = JobSession(64, max_epochs=5, train_iters=64, world_size=2, rank=1, decide=decide)
    with pytest.raises(ZeusCostThresholdExceededError):
        for _ in s.epochs():
            s.begin_epoch("train")
            s.end_epoch("train")
            s.profiling = False
    assert decisions == [False]


def test_protocol_errors_name_the_variable(a40, monkeypatch) -> None:
    monkeypatch.setenv("ZEUS_PROFILE_PARAMS", "ten")
    with pytest.raises(ValueError, match="ZEUS_PROFILE_PARAMS.*ten"):
        JobSession(64, 5, 64)
    monkeypatch.delenv("ZEUS_PROFILE_PARAMS")
    monkeypatch.delenv("ZEUS_TARGET_METRIC")
    with pytest.raises(ValueError, match="ZEUS_TARGET_METRIC"):
        JobSession(64, 5, 64)
    monkeypatch.setenv("ZEUS_TARGET_METRIC", "1")
    with pytest.raises(RuntimeError, match="too few"):
        JobSession(64, 5, train_iters=1)


def test_power_limit_steps_and_optimum() -> None:
    assert power_limit_steps(100_000, 300_000)[-1] == 100_000
    assert power_limit_steps(115_000, 260_000) == [
        260_000,
        235_000,
        210_000,
        185_000,
        160_000,
        135_000,
    ]
    power = {300_000: 300.0, 200_000: 150.0}
    tput = {300_000: 10.0, 200_000: 9.0}
    assert compute_optimal_pl(power, tput, 0.5) == 200_000
    assert compute_optimal_pl(power, tput, 0.0) == 300_000
    # Two GPUs: the same per-GPU figures, summed, choose the same limit.
    doubled = {pl: 2 * p for pl, p in power.items()}
    assert compute_optimal_pl(doubled, tput, 0.5, world_size=2) == 200_000


CONVERGE = "32:3,64:2,128:4"


def make_job(tmp_path: Path, max_epochs: int = 6) -> Job:
    return Job(
        "synthetic",
        "none",
        "adam",
        0.5,
        max_epochs,
        default_bs=64,
        default_lr=0.01,
        workdir=str(tmp_path),
        command=[
            sys.executable,
            str(SCRIPT),
            "--bs",
            "{bs}",
            "--lr",
            "{lr}",
            "--epochs",
            "{epochs}",
            "--seed",
            "{seed}",
            "--converge",
            CONVERGE,
        ],
    )


def test_master_runs_recurrences_with_retries_and_early_stop(a40, tmp_path: Path, capsys) -> None:
    master = ZeusMaster(
        PruningGTSBatchSizeOptimizer(seed=3, verbose=False),
        log_base=str(tmp_path / "base"),
        monitor_path="/usr/bin/zeus_monitor",
        seed=7,
        profile_warmup_iters=2,
        profile_measure_iters=4,
    )
    assert master.max_pl == 300
    job = make_job(tmp_path)
    hist = master.run(
        job, num_recurrence=6, batch_sizes=[32, 64, 128, 256], beta_knob=2.0, eta_knob=0.5
    )
    (logdir,) = (tmp_path / "base").iterdir()
    assert re.fullmatch(
        re.escape(job.to_logdir()) + r"\+x6\+eta0\.5\+beta2\.0\+\d{14}", logdir.name
    )
    # Pruning starts at the default and walks down (32), then up (128).
    bss = [h.bs for h in hist]
    assert bss[:3] == [64, 32, 128]
    assert sum(h.reached for h in hist) == 6
    # Some run missed the target (stopped early) and was retried within its recurrence.
    i = next(k for k, h in enumerate(hist) if not h.reached)
    assert hist[i + 1].reached
    files = {p.name for p in logdir.iterdir()}
    assert {"history.py", "rec01+try01.train.log", "rec01+try01+bs64.train.json"} <= files
    assert {f"bs{b}.power.json" for b in set(bss)} <= files
    (failed,) = [
        n
        for n in files
        if n.endswith(f"+bs{bss[i]}.train.json")
        and "try02" not in n
        and not json.loads((logdir / n).read_text())["reached"]
    ]
    assert failed.replace(f"+bs{bss[i]}.train.json", "").endswith("+try01")
    # It was stopped by the cost threshold (β × min cost) before max_epochs, although it
    # would have converged at epoch 4.
    res = json.loads((logdir / failed).read_text())
    assert res["num_epochs"] < 4
    log = (logdir / failed.replace(f"+bs{bss[i]}.train.json", ".train.log")).read_text()
    assert "exceeds cost threshold" in log
    retry = failed.replace("try01", "try02")
    assert json.loads((logdir / retry.replace(f"+bs{bss[i]}", f"+bs{hist[i + 1].bs}")).read_text())[
        "reached"
    ]
    # history.py holds the entries.
    parsed = (logdir / "history.py").read_text()
    assert parsed.count("HistoryEntry(") == len(hist)
    out = capsys.readouterr().out
    assert "rec01+try01: bs=64 lr=0.01 seed=7" in out
    assert f"seed={7 + len(hist) - 1}" in out


def test_master_validates_inputs(a40, tmp_path: Path) -> None:
    bso = PruningGTSBatchSizeOptimizer(verbose=False)
    with pytest.raises(ValueError, match="monitor_path"):
        ZeusMaster(bso, str(tmp_path), "zeus_monitor")
    with pytest.raises(ValueError, match="log_base"):
        ZeusMaster(bso, "relative", "/x")
    m = ZeusMaster(bso, str(tmp_path / "b"), "/x")
    with pytest.raises(ValueError, match="eta_knob"):
        m.run(make_job(tmp_path), 1, [64], 2.0, 1.5)
    with pytest.raises(ValueError, match="command"):
        m.run(Job("d", "n", "adam", 0.5, 3, default_bs=64, default_lr=0.1), 1, [64], 2.0, 0.5)


def test_master_default_that_fails_and_missing_json(a40, tmp_path: Path) -> None:
    m = ZeusMaster(
        PruningGTSBatchSizeOptimizer(verbose=False),
        str(tmp_path / "b"),
        "/x",
        profile_warmup_iters=2,
        profile_measure_iters=4,
    )
    job = make_job(tmp_path)
    never = Job(**{**job.__dict__, "default_bs": 256})
    with pytest.raises(RuntimeError, match="default batch size 256 did not converge"):
        m.run(never, 2, [64, 256], 2.0, 0.5)
    broken = Job(**{**job.__dict__, "command": [sys.executable, "-c", "print('hi')"]})
    with pytest.raises(RuntimeError, match=r"train\.json was not written"):
        m.run(broken, 1, [64], 2.0, 0.5)


def test_importing_zeus_run_does_not_import_torch() -> None:
    code = (
        "import sys, zeus.run, zeus.job, zeus.policy, zeus.simulate; print('torch' in sys.modules)"
    )
    out = os.popen(f'{sys.executable} -c "{code}"').read().strip()
    assert out == "False"


def test_zeus_dataloader_with_a_tiny_cpu_model(a40, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from zeus.run import ZeusDataLoader

    ZeusDataLoader.reset()
    torch.manual_seed(0)
    x = torch.randn(512, 4)
    y = (x.sum(dim=1) > 0).long()
    data = torch.utils.data.TensorDataset(x, y)
    train_loader = ZeusDataLoader(data, batch_size=8, max_epochs=6, shuffle=True)
    eval_loader = ZeusDataLoader(data, batch_size=64)
    with pytest.raises(ValueError, match="max_epochs only"):
        ZeusDataLoader(data, batch_size=8, max_epochs=3)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    epochs = []
    try:
        for epoch in train_loader.epochs():
            epochs.append(epoch)
            for xb, yb in train_loader:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
                zeus.device.sim.run(0.05, [0])  # the GPU's share of the step
            correct = 0
            with torch.no_grad():
                for xb, yb in eval_loader:
                    correct += int((model(xb).argmax(1) == yb).sum())
                    zeus.device.sim.run(0.05, [0])
            train_loader.report_metric(correct / len(data), higher_is_better=True)
    finally:
        ZeusDataLoader.reset()
    assert epochs == [0]
    logs = tmp_path / "logs"
    result = json.loads((logs / "zeus+bs8.train.json").read_text())
    assert result["reached"] is True and result["num_epochs"] == 1
    power = json.loads((logs / "bs8.power.json").read_text())
    assert power["optimal_pl"] == expected_optimal_pl() * 1000
    assert not math.isnan(result["energy"])


def test_observer_mode_profiles_but_trains_at_the_maximum(a40, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ZEUS_USE_OPTIMAL_PL", "False")
    s = JobSession(64, max_epochs=5, train_iters=64, eval_iters=4)
    train(s, 64, reach_at=3)
    power = json.loads((tmp_path / "logs" / "bs64.power.json").read_text())
    assert power["optimal_pl"] == expected_optimal_pl() * 1000  # still computed and saved
    assert a40.get_power_management_limit(0) == 300_000
    s2 = JobSession(64, max_epochs=5, train_iters=64, eval_iters=4)
    train(s2, 64, reach_at=2)
    assert a40.get_power_management_limit(0) == 300_000


def test_data_parallel_job_stops_on_every_rank(sim_gpus, monkeypatch, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import socket
    import subprocess

    sim_gpus("A40,A40", clock="virtual")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ)
    env.update(
        ZEUS_TARGET_METRIC="1.0",
        ZEUS_LOG_DIR=str(tmp_path),
        ZEUS_JOB_ID="dp",
        ZEUS_PROFILE_PARAMS="2,4",
        ZEUS_COST_THRESH="4000",
    )
    script = Path(__file__).with_name("dp_train.py")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), "--rank", str(r), "--port", str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    # Both ranks stop together, after profiling (3 epochs: no check before) and before
    # max_epochs.
    n = {re.search(r"stopped after (\d+) epochs", o).group(1) for o in outs}  # type: ignore[union-attr]
    assert len(n) == 1 and 3 < int(n.pop()) < 20, outs
    result = json.loads((tmp_path / "dp+bs16.train.json").read_text())
    assert result["reached"] is False and result["cost"] < 4000
    power = json.loads((tmp_path / "bs16.power.json").read_text())
    assert len(power["train_power"]) == 9


def test_zeus_dataloader_takes_batch_size_by_keyword_only() -> None:
    torch = pytest.importorskip("torch")
    from zeus.run import ZeusDataLoader

    ZeusDataLoader.reset()
    data = torch.utils.data.TensorDataset(torch.zeros(16, 2))
    try:
        # DataLoader's second positional parameter is batch_size: a positional value would
        # be a second batch size, so it is refused before anything is registered.
        with pytest.raises(TypeError, match="positional"):
            ZeusDataLoader(data, 4, batch_size=4)  # type: ignore[misc]
        with pytest.raises(TypeError, match="positional"):
            ZeusDataLoader(data, 4)  # type: ignore[call-arg]
        assert ZeusDataLoader.train_loader is None and ZeusDataLoader.eval_loader is None
        loader = ZeusDataLoader(dataset=data, batch_size=4)
        assert loader.batch_size == 4 and ZeusDataLoader.eval_loader is loader
    finally:
        ZeusDataLoader.reset()
