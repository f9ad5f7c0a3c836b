"""The vLLM stat logger (`zeus.monitor.serving.vllm`) on the simulated GPU (virtual clock,
ideal readings).

A small engine simulation here schedules requests (FCFS, a batch limit, one token per request
per step), sets the GPU's power from each step's work, advances the clock, and hands the
logger what vLLM's frontend would: `IterationStats` and `SchedulerStats` per step. Two
builders make them: `mirror` (dataclasses with vLLM 0.33's fields, computed as its
`OutputProcessor` does; always runs) and `vllm` (vLLM's own `OutputProcessor` fed
`EngineCoreOutput`s, its own stats classes, and the class `zeus_stat_logger` makes driven
through vLLM's `PerEngineStatLoggerAdapter`; runs where vLLM is importable).
"""

from __future__ import annotations

import abc
import math
import subprocess
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
import zeus.device.sim as sim
from zeus.monitor import ZeusMonitor
from zeus.monitor.serving import EnergyLedger
from zeus.monitor.serving.vllm import ZeusStatLogger, zeus_stat_logger

try:
    import time

    from vllm import SamplingParams
    from vllm.config import DeviceConfig, VllmConfig
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.metrics import stats as vstats
    from vllm.v1.metrics.loggers import PerEngineStatLoggerAdapter, StatLoggerBase

    HAVE_VLLM = True
except Exception:  # vLLM or one of its dependencies is missing
    HAVE_VLLM = False

IDLE_W, A, B, C = 90.0, 0.012, 0.05, 0.002  # W, J/prefill token, J/decode token, W/KV token
STEP_S = 0.03

needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not importable")
BUILDERS = ["mirror", pytest.param("vllm", marks=needs_vllm)]


# vLLM 0.33's stats, as far as the logger reads them (vllm/v1/metrics/stats.py).


@dataclass
class PromptTokenStats:
    computed: int = 0
    total: int = 0


@dataclass
class FinishedRequestStats:
    finish_reason: int
    request_id: str | None = None
    e2e_latency: float = 0.0
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_cached_tokens: int = 0


@dataclass
class IterationStats:
    iteration_timestamp: float
    num_generation_tokens: int = 0
    prompt_token_stats: PromptTokenStats = field(default_factory=PromptTokenStats)
    time_to_first_tokens_iter: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)
    num_preempted_reqs: int = 0


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_skipped_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0


@dataclass
class Job:
    rid: str
    arrival: float  # s after the start
    prompt: int
    output: int
    cached: int = 0
    abort_at: int | None = None  # aborted by the client after this many tokens
    t_arrival: float = 0.0  # on the GPUs' clock
    generated: int = 0


class MirrorBuilder:
    """Stats as vLLM's frontend computes them (`IterationStats.update_from_output` and
    `update_from_finished_request`): TTFT and e2e latency from the iteration timestamp."""

    def add(self, job: Job) -> None:
        pass

    def abort(self, job: Job) -> None:
        pass

    def step(self, ts, new, old, finished, n_running, n_waiting):
        sched = SchedulerStats(num_running_reqs=n_running, num_waiting_reqs=n_waiting)
        if not (new or old):
            return sched, None
        it = IterationStats(iteration_timestamp=ts, num_generation_tokens=len(new) + len(old))
        for j in new:
            it.prompt_token_stats.total += j.prompt
            it.prompt_token_stats.computed += j.prompt - j.cached
            it.time_to_first_tokens_iter.append(ts - j.t_arrival)
        for j in finished:
            it.finished_requests.append(
                FinishedRequestStats(
                    finish_reason=1,
                    request_id=j.rid,
                    e2e_latency=ts - j.t_arrival,
                    num_prompt_tokens=j.prompt,
                    num_generation_tokens=j.generated,
                    num_cached_tokens=j.cached,
                )
            )
        return sched, it


class VllmBuilder:
    """vLLM's own `OutputProcessor` turns engine outputs into its stats."""

    def __init__(self) -> None:
        self.op = OutputProcessor(None, log_stats=True)

    def add(self, job: Job) -> None:
        req = EngineCoreRequest(
            request_id=f"{job.rid}-internal",
            prompt_token_ids=[7] * job.prompt,
            mm_features=None,
            sampling_params=SamplingParams(max_tokens=job.output, detokenize=False),
            pooling_params=None,
            arrival_time=job.t_arrival,
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
        )
        req.external_req_id = job.rid
        self.op.add_request(req, None)

    def abort(self, job: Job) -> None:
        self.op.abort_requests([job.rid], internal=False)

    def step(self, ts, new, old, finished, n_running, n_waiting):
        sched = vstats.SchedulerStats(num_running_reqs=n_running, num_waiting_reqs=n_waiting)
        outs = []
        for j in old + new:
            ps = None
            if j in new:
                ps = vstats.PrefillStats()
                ps.set(j.prompt, j.cached, 0)
            outs.append(
                EngineCoreOutput(
                    request_id=f"{j.rid}-internal",
                    new_token_ids=[5],
                    prefill_stats=ps,
                    finish_reason=FinishReason.LENGTH if j in finished else None,
                )
            )
        if not outs:  # AsyncLLM: no IterationStats for a step with no output
            return sched, None
        it = vstats.IterationStats()
        it.iteration_timestamp = ts  # the GPUs' (virtual) clock instead of time.time()
        self.op.process_outputs(outs, engine_core_timestamp=time.monotonic(), iteration_stats=it)
        return sched, it


@dataclass
class Run:
    truth: dict[str, float]  # each request's energy, split equally among a step's requests
    residual: float  # true energy of the stretches with no request (start-up, idle)
    started_with: dict[str, int]  # requests that got their first token in the same step
    finished: dict[str, Job]


def run_engine(
    record, log, builder, jobs: list[Job], *, max_batch: int = 4, idle_log: bool = True
) -> Run:
    """Simulate the engine; `record(sched, it)` and `log()` are the logger's (or vLLM's)."""
    t0 = sim.now()
    for j in jobs:
        j.t_arrival = t0 + j.arrival
        builder.add(j)
    waiting = sorted(jobs, key=lambda j: j.arrival)
    running: list[Job] = []
    truth = {j.rid: 0.0 for j in jobs}
    started_with: dict[str, int] = {}
    done: dict[str, Job] = {}
    residual = 0.0
    while waiting or running:
        if not running and waiting[0].t_arrival > sim.now():
            e0 = sim.true_energy(0)
            sim.advance(waiting[0].t_arrival - sim.now())
            if idle_log:
                residual += sim.true_energy(0) - e0
                log()
        for j in [j for j in running if j.abort_at is not None and j.generated >= j.abort_at]:
            running.remove(j)
            builder.abort(j)
        arrived = [j for j in waiting if j.t_arrival <= sim.now()]
        new = arrived[: max_batch - len(running)]
        for j in new:
            waiting.remove(j)
            started_with[j.rid] = len(new)
        old = list(running)
        p = sum(j.prompt - j.cached for j in new)
        k = sum(j.prompt + j.generated for j in old) + sum(j.prompt for j in new)
        dt = STEP_S + 1e-5 * p
        sim.set_power(0, IDLE_W + (A * p + B * len(old)) / dt + C * k)
        e0 = sim.true_energy(0)
        sim.advance(dt)
        step_j = sim.true_energy(0) - e0
        sim.set_power(0, IDLE_W)
        members = old + new
        for j in members:
            truth[j.rid] += step_j / len(members)
            j.generated += 1
        finished = [j for j in members if j.generated >= j.output]
        running = [j for j in members if j not in finished]
        done.update((j.rid, j) for j in finished)
        n_waiting = sum(1 for j in waiting if j.t_arrival <= sim.now())
        sched, it = builder.step(sim.now(), new, old, finished, len(running), n_waiting)
        record(sched, it)
    return Run(truth, residual, started_with, done)


def schedule() -> list[Job]:
    """Two bursts with an idle gap; two requests share an arrival time (as `n > 1` samples
    do), a few start together, one is prompt-cached, one finishes at its first token."""
    jobs = [
        Job("a", 0.0, 300, 12),
        Job("b", 0.0, 200, 5),
        Job("c", 0.01, 120, 9, cached=64),
        Job("d", 0.05, 500, 1),
        Job("e", 0.05, 80, 20),
        Job("f", 0.2, 40, 7),
        Job("g", 0.21, 600, 15),
        Job("h", 0.4, 100, 3),
    ]
    jobs += [Job(f"x{i}", 2.0 + 0.013 * i, 50 + 37 * i, 4 + 3 * i) for i in range(7)]
    jobs[1].arrival = jobs[0].arrival  # the same float: a key shared by two requests
    return jobs


def make_logger(builder_name: str, ledger: EnergyLedger):
    """The logger as vLLM would drive it: (record, log, logger instance, stats builder)."""
    if builder_name == "vllm":
        cls = zeus_stat_logger(ledger)
        assert issubclass(cls, StatLoggerBase)
        config = VllmConfig(device_config=DeviceConfig(device="cpu"))
        adapter = PerEngineStatLoggerAdapter(config, [0], cls)
        adapter.log_engine_initialized()

        def record(sched, it):
            adapter.record(scheduler_stats=sched, iteration_stats=it, engine_idx=0)

        return record, adapter.log, cls.loggers[0], VllmBuilder()
    lg = ZeusStatLogger(ledger)
    lg.log_engine_initialized()
    return lg.record, lg.log, lg, MirrorBuilder()


@pytest.mark.parametrize("builder_name", BUILDERS)
@pytest.mark.parametrize("method", ["time", "tokens", "work"])
def test_records_tokens_and_conservation(sim_gpus, builder_name, method):
    sim_gpus("H100")
    sim.set_power(0, IDLE_W)
    e_start = sim.true_energy(0)
    ledger = EnergyLedger(ZeusMonitor(gpu_indices=[0]), method=method, min_spans=2, span_s=0.1)
    sim.advance(1.5)  # the engine loads: goes to the residual
    startup = sim.true_energy(0) - e_start
    record, log, lg, builder = make_logger(builder_name, ledger)
    jobs = schedule()
    run = run_engine(record, log, builder, jobs)
    totals = ledger.close()
    true_j = sim.true_energy(0) - e_start

    # Energy: the counter counts whole millijoules; nothing waits; records + residual = all.
    assert totals.measured == pytest.approx(true_j, abs=2e-3)
    assert totals.pending == 0.0
    recs = {r.request_id: r for r in lg.records}
    assert len(lg.records) == len(jobs) == len(ledger.records)
    assert set(recs) == {j.rid for j in jobs}
    attributed = sum(r.energy for r in lg.records)
    assert attributed == pytest.approx(totals.requests, rel=1e-9, abs=1e-9)
    assert attributed + totals.residual == pytest.approx(totals.measured, rel=1e-9, abs=1e-9)
    # The ledger's own records carry the placeholders.
    assert all(r.request_id.startswith("vllm-0-") for r in ledger.records)
    assert lg.running == 0 and lg.dropped == 0 and lg.untracked == 0 and lg.errors == 0

    # Tokens as the stats give them.
    for j in jobs:
        r = recs[j.rid]
        assert r.finished and r.method == method
        assert r.output_tokens == j.output
        assert r.decode_tokens == pytest.approx(j.output - 1)
        assert r.steps == j.output
        if run.started_with[j.rid] == 1:
            assert r.prefill_tokens == pytest.approx(j.prompt - j.cached)
    assert sum(r.prefill_tokens for r in lg.records) == pytest.approx(
        sum(j.prompt - j.cached for j in jobs)
    )
    # Start-up and the idle gap went to the residual (cut by log_engine_initialized, log()).
    assert totals.residual >= startup + run.residual - 1e-2
    if method == "time":
        # Equal shares of each step: each request's steps were found exactly.
        assert totals.residual == pytest.approx(startup + run.residual, abs=1e-2)
        for j in jobs:
            assert recs[j.rid].energy == pytest.approx(run.truth[j.rid], rel=1e-6, abs=1e-2)


@pytest.mark.parametrize("builder_name", BUILDERS)
def test_aborted_request_is_dropped_and_reported_unfinished(sim_gpus, builder_name):
    sim_gpus("H100")
    sim.set_power(0, IDLE_W)
    e_start = sim.true_energy(0)
    ledger = EnergyLedger(ZeusMonitor(gpu_indices=[0]), method="time")
    record, log, lg, builder = make_logger(builder_name, ledger)
    jobs = [
        Job("long", 0.0, 100, 50, abort_at=6),  # the client leaves after 6 tokens
        Job("p", 0.05, 60, 10),
        Job("q", 0.1, 70, 12),
    ]
    run = run_engine(record, log, builder, jobs)
    totals = ledger.close()
    assert lg.dropped == 1 and lg.running == 0
    recs = {r.request_id: r for r in lg.records}
    assert set(recs) == {"p", "q", "vllm-0-0"}  # the aborted one keeps its placeholder
    gone = recs["vllm-0-0"]
    assert not gone.finished and gone.steps == 6
    assert gone.energy == pytest.approx(run.truth["long"], rel=1e-6, abs=1e-2)
    for rid in ("p", "q"):
        assert recs[rid].finished
        assert recs[rid].energy == pytest.approx(run.truth[rid], rel=1e-6, abs=1e-2)
    assert totals.pending == 0.0
    assert totals.measured == pytest.approx(sim.true_energy(0) - e_start, abs=2e-3)
    assert sum(r.energy for r in lg.records) + totals.residual == pytest.approx(
        totals.measured, rel=1e-9
    )


def test_untracked_finish_gets_an_empty_record(sim_gpus):
    sim_gpus("H100")
    ledger = EnergyLedger(ZeusMonitor(gpu_indices=[0]), method="tokens")
    lg = ZeusStatLogger(ledger)
    seen = []
    lg.callback = seen.append
    sim.advance(0.1)
    ts = sim.now()
    it = IterationStats(iteration_timestamp=ts)
    it.finished_requests.append(FinishedRequestStats(2, request_id="z", e2e_latency=0.05))
    lg.record(SchedulerStats(), it)
    ledger.close()
    assert lg.untracked == 1
    assert [(r.request_id, r.steps, r.energy, r.finished) for r in seen] == [("z", 0, 0.0, True)]


def test_records_of_other_engines_and_empty_steps(sim_gpus):
    sim_gpus("H100")
    sim.set_power(0, IDLE_W)
    ledger = EnergyLedger(ZeusMonitor(gpu_indices=[0]), method="tokens")
    lg = ZeusStatLogger(ledger, engine_index=1)
    ts = sim.now()
    it = IterationStats(ts, num_generation_tokens=1, time_to_first_tokens_iter=[0.0])
    lg.record(SchedulerStats(num_running_reqs=1), it, engine_idx=0)  # not this engine's
    assert lg.running == 0 and ledger.totals().steps == 0
    # A step with only a prefill chunk (no output) is left to the next step with outputs.
    sim.advance(0.2)
    lg.record(SchedulerStats(num_running_reqs=1), None, engine_idx=1)
    assert ledger.totals().seconds == 0.0
    lg.log()  # not idle: the scheduler holds a request
    assert ledger.totals().seconds == 0.0
    sim.advance(0.1)
    ts = sim.now()
    it = IterationStats(ts, 1, PromptTokenStats(50, 50), [0.3])
    lg.record(SchedulerStats(num_running_reqs=1), it, engine_idx=1)
    t = ledger.totals()
    assert t.steps == 1 and t.measured == pytest.approx(0.3 * IDLE_W, abs=2e-3)
    assert t.residual == 0.0


def test_record_never_raises(sim_gpus):
    sim_gpus("H100")
    ledger = EnergyLedger(ZeusMonitor(gpu_indices=[0]), method="tokens")
    lg = ZeusStatLogger(ledger)
    lg.record(SchedulerStats(), object())  # no such attributes
    bad = IterationStats(sim.now(), num_generation_tokens=1, time_to_first_tokens_iter=[0.0])
    bad.prompt_token_stats = PromptTokenStats(computed=-5, total=-5)  # the ledger refuses
    lg.record(SchedulerStats(num_running_reqs=1), bad)
    assert lg.errors == 2
    ledger.close()
    lg.log_engine_initialized()  # a closed ledger
    assert lg.errors == 3


def test_a_raising_callback_loses_no_record(sim_gpus):
    sim_gpus("H100")
    ledger = EnergyLedger(ZeusMonitor(gpu_indices=[0]), method="time")
    lg = ZeusStatLogger(ledger, callback=lambda r: 1 / 0)
    sim.advance(0.05)
    it = IterationStats(sim.now(), 2, PromptTokenStats(10, 10), [0.05, 0.04])
    it.finished_requests += [
        FinishedRequestStats(1, "r", 0.05, 5, 1),
        FinishedRequestStats(1, "s", 0.04, 5, 1),
    ]
    lg.record(SchedulerStats(), it)
    ledger.close()
    assert [r.request_id for r in lg.records] == ["r", "s"]
    assert len(ledger.records) == 2 and lg.errors == 2


def test_ledger_callback_still_called(sim_gpus):
    sim_gpus("H100")
    before = []
    ledger = EnergyLedger(ZeusMonitor(gpu_indices=[0]), method="time", callback=before.append)
    lg = ZeusStatLogger(ledger, model="m")
    sim.advance(0.05)
    ts = sim.now()
    it = IterationStats(ts, 1, PromptTokenStats(10, 10), [0.05])
    it.finished_requests.append(FinishedRequestStats(1, "r", 0.05, 10, 1))
    lg.record(SchedulerStats(), it)
    ledger.close()
    assert [r.request_id for r in before] == ["vllm-0-0"]
    assert [(r.request_id, r.model) for r in lg.records] == [("r", "m")]


def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> type:
    """A `vllm.v1.metrics.loggers` with vLLM 0.33's `StatLoggerBase` (abstract methods)."""

    class StatLoggerBase(abc.ABC):
        @abc.abstractmethod
        def __init__(self, vllm_config: Any, engine_index: int = 0): ...

        @abc.abstractmethod
        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0): ...

        @abc.abstractmethod
        def log_engine_initialized(self): ...

        def log(self):  # noqa: B027
            pass

    for name in ("vllm", "vllm.v1", "vllm.v1.metrics"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    mod = types.ModuleType("vllm.v1.metrics.loggers")
    mod.StatLoggerBase = StatLoggerBase  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.v1.metrics.loggers", mod)
    return StatLoggerBase


def test_factory_makes_a_stat_logger_class(sim_gpus, monkeypatch):
    sim_gpus("H100,H100")
    base = fake_vllm(monkeypatch)
    config = types.SimpleNamespace(model_config=types.SimpleNamespace(served_model_name="llm"))
    ledger = EnergyLedger(ZeusMonitor(gpu_indices=[0]), method="time")
    cls = zeus_stat_logger(ledger)
    assert issubclass(cls, base) and issubclass(cls, ZeusStatLogger)
    lg = cls(config, 0)  # as vLLM calls a per-engine factory
    assert cls.loggers == {0: lg} and lg.ledger is ledger and lg.model == "llm"
    with pytest.raises(ValueError, match="one ledger per engine"):
        cls(config, 1)
    # One ledger per engine from a function of the engine index; the ledger's model wins.
    made: dict[int, EnergyLedger] = {}

    def per_engine(i: int) -> EnergyLedger:
        made[i] = EnergyLedger(ZeusMonitor(gpu_indices=[i]), method="time", model="own")
        return made[i]

    cls2 = zeus_stat_logger(per_engine)
    l0, l1 = cls2(config, 0), cls2(config, 1)
    assert (l0.ledger, l1.ledger) == (made[0], made[1]) and l0.model is None
    assert cls2.loggers == {0: l0, 1: l1} and cls.loggers == {0: lg}
    for led in (ledger, *made.values()):
        led.close()


def test_factory_needs_vllm(monkeypatch):
    for name in ("vllm", "vllm.v1", "vllm.v1.metrics", "vllm.v1.metrics.loggers"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it fails
    with pytest.raises(ImportError, match="vLLM"):
        zeus_stat_logger(lambda i: None)  # type: ignore[arg-type,return-value]


def test_zeus_imports_without_vllm():
    code = (
        "import sys, zeus.monitor.serving.vllm as m; "
        "assert not any(k == 'vllm' or k.startswith('vllm.') for k in sys.modules); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


@needs_vllm
def test_real_stats_classes_have_the_fields_read():
    it = vstats.IterationStats()
    for name in (
        "iteration_timestamp",
        "num_generation_tokens",
        "prompt_token_stats",
        "time_to_first_tokens_iter",
        "finished_requests",
    ):
        assert hasattr(it, name)
    f = vstats.FinishedRequestStats(finish_reason=FinishReason.STOP)
    for name in ("request_id", "e2e_latency", "num_generation_tokens", "num_prompt_tokens"):
        assert hasattr(f, name)
    s = vstats.SchedulerStats()
    assert math.isfinite(s.num_running_reqs + s.num_waiting_reqs + s.num_skipped_waiting_reqs)
