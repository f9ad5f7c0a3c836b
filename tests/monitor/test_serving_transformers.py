"""`zeus.monitor.serving.transformers`: transformers' continuous batching reported to an
`EnergyLedger`, on a tiny random Llama built locally (CPU, SDPA attention) and the simulated H100.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import zeus.device.sim as sim
from zeus.monitor import ZeusMonitor
from zeus.monitor.serving import EnergyLedger
from zeus.monitor.serving.transformers import (
    ContinuousBatchingEnergy,
    _StepWork,
    track_continuous_batching,
)

MAX_NEW = 12
# Prompts of 3..38 tokens; with `SMALL` the longer ones are prefilled in chunks of 16 tokens, at
# most 4 requests run per step, and the 8-block cache forces requests out and back in.
PROMPTS = [[(7 * i + j) % 120 + 1 for j in range(3 + 5 * i)] for i in range(8)]
SMALL = {"num_blocks": 8, "page_size": 16, "max_batch_tokens": 16, "max_requests_per_batch": 4}
ROOMY = {"num_blocks": 16, "page_size": 32, "max_batch_tokens": 64}


class Engine:
    """A tiny model and the configurations it generates with."""

    def __init__(self) -> None:
        torch = pytest.importorskip("torch")
        transformers = pytest.importorskip("transformers")
        torch.manual_seed(0)
        config = transformers.LlamaConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        )
        self.model = transformers.LlamaForCausalLM(config).eval()
        # eos -1: every request generates exactly its max_new_tokens.
        self.generation = transformers.GenerationConfig(
            do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=-1, pad_token_id=0
        )
        self.transformers = transformers

    def cb_config(self, sizes: dict[str, int]) -> Any:
        return self.transformers.ContinuousBatchingConfig(**sizes)

    def generate(self, sizes: dict[str, int] = SMALL) -> dict[str, list[int]]:
        out = self.model.generate_batch(
            PROMPTS,
            generation_config=self.generation,
            continuous_batching_config=self.cb_config(sizes),
        )
        return {rid: list(o.generated_tokens) for rid, o in out.items()}


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model is fastest on one thread
    yield Engine()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference(engine: Engine) -> dict[str, list[int]]:
    """What the engine generates without a ledger."""
    out = engine.generate()
    assert len(out) == len(PROMPTS)
    assert all(len(tokens) == MAX_NEW for tokens in out.values())
    return out


def assert_conserved(ledger: EnergyLedger) -> None:
    t = ledger.totals()
    assert t.measured == pytest.approx(t.requests + t.residual + t.pending, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("method", ["tokens", "work", "time"])
def test_generate_batch_is_unchanged_and_every_request_is_accounted(
    sim_gpus: Any, engine: Engine, reference: dict[str, list[int]], method: str
) -> None:
    sim_gpus("H100", clock="real")
    with EnergyLedger(method=method, model="tiny") as ledger:
        with track_continuous_batching(engine.model, ledger) as tracker:
            out = engine.generate()
        assert_conserved(ledger)
    assert tracker.errors == 0
    assert not tracker.attached and "init_continuous_batching" not in vars(engine.model)

    assert out == reference
    records = {r.request_id: r for r in ledger.records}
    assert set(records) == set(reference)
    for rid, tokens in out.items():
        r = records[rid]
        assert r.finished and r.model == "tiny"
        assert r.output_tokens == len(tokens)
        assert r.steps > 0 and r.energy > 0.0 and r.energy_bound >= 0.0
    # Every prompt token went through a prefill (more when the cache pushed a request out).
    prompt = {f"req_{i}": len(p) for i, p in enumerate(PROMPTS)}
    assert all(records[rid].prefill_tokens >= prompt[rid] for rid in records)

    t = ledger.totals()
    assert t.pending == 0.0
    assert t.measured == pytest.approx(t.requests + t.residual, rel=1e-9)
    assert sum(r.energy for r in records.values()) + t.residual == pytest.approx(
        t.measured, rel=1e-9
    )
    assert ledger.open_requests == 0


IDLE_W, W_PER_TOKEN, STEP_S, GAP_S = 60.0, 2.0, 0.01, 0.002


class StepPoweredLedger(EnergyLedger):
    """A ledger whose simulated GPU follows the engine: between steps it idles for `GAP_S`, and
    a step lasts `STEP_S` at `IDLE_W + W_PER_TOKEN * tokens in the step` (virtual clock)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[tuple[list[str], list[float], float]] = []
        self.gaps = 0

    def begin_step(self) -> None:
        sim.set_power(0, IDLE_W)
        sim.advance(GAP_S)
        self.gaps += 1
        super().begin_step()

    def end_step(
        self,
        request_ids: Sequence[str],
        prefill_tokens: Sequence[float],
        decode_tokens: Sequence[float],
        kv_tokens: Sequence[float],
    ) -> None:
        tokens = [p + d for p, d in zip(prefill_tokens, decode_tokens)]
        watts = IDLE_W + W_PER_TOKEN * sum(tokens)
        sim.set_power(0, watts)
        sim.advance(STEP_S)
        self.steps.append((list(request_ids), tokens, watts * STEP_S))
        super().end_step(request_ids, prefill_tokens, decode_tokens, kv_tokens)


def test_request_energy_follows_the_power_of_its_steps(
    sim_gpus: Any, engine: Engine, reference: dict[str, list[int]]
) -> None:
    sim_gpus("H100", clock="virtual")
    sim.set_power(0, IDLE_W)
    with StepPoweredLedger(ZeusMonitor(gpu_indices=[0]), method="tokens") as ledger:
        with track_continuous_batching(engine.model, ledger):
            out = engine.generate()
    assert out == reference

    # `tokens`: each step's energy is split in proportion to the tokens each request processed.
    expected: dict[str, float] = {}
    for ids, tokens, energy in ledger.steps:
        for rid, n in zip(ids, tokens):
            expected[rid] = expected.get(rid, 0.0) + energy * n / sum(tokens)
    assert ledger.gaps == len(ledger.steps) > len(PROMPTS)
    records = {r.request_id: r for r in ledger.records}
    assert set(records) == set(expected) == set(reference)
    for rid, r in records.items():
        assert r.prefill_energy > 0.0 and r.decode_energy > 0.0
        assert abs(r.energy - expected[rid]) <= r.energy_bound + 1e-9, rid
        assert r.prefill_energy + r.decode_energy == pytest.approx(r.energy, rel=1e-9)

    t = ledger.totals()
    assert t.measured == pytest.approx(
        sum(e for _, _, e in ledger.steps) + IDLE_W * GAP_S * ledger.gaps,
        abs=t.residual_bound + sum(r.energy_bound for r in records.values()),
    )
    assert t.residual == pytest.approx(IDLE_W * GAP_S * ledger.gaps, abs=t.residual_bound + 1e-9)
    assert sum(r.energy for r in records.values()) + t.residual == pytest.approx(
        t.measured, rel=1e-9
    )


class ActingLedger(EnergyLedger):
    """Calls `act()` from the generation thread once request `victim` has decoded `after`
    tokens (the engine's own thread, so that what the test does never depends on timing)."""

    def __init__(
        self, manager: Any, victim: str, after: int, act: Any, *args: Any, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self.manager, self.victim, self.after, self.act, self.seen = (
            manager,
            victim,
            after,
            act,
            0,
        )

    def end_step(
        self,
        request_ids: Sequence[str],
        prefill_tokens: Sequence[float],
        decode_tokens: Sequence[float],
        kv_tokens: Sequence[float],
    ) -> None:
        super().end_step(request_ids, prefill_tokens, decode_tokens, kv_tokens)
        if self.victim in request_ids:
            self.seen += int(decode_tokens[list(request_ids).index(self.victim)])
            if self.seen == self.after:
                self.act()


def run_manager(
    manager: Any, requests: dict[str, tuple[list[int], int]], finished: int
) -> dict[str, Any]:
    """Run `requests` (`{id: (prompt, max_new_tokens)}`) on a started `manager` until
    `finished` of them are; stop and destroy it whatever happens."""
    manager.start()
    try:
        for rid, (prompt, new_tokens) in requests.items():
            manager.add_request(prompt, request_id=rid, max_new_tokens=new_tokens)
        results: dict[str, Any] = {}
        while len(results) < finished:
            result = manager.get_result(timeout=60)
            assert result is not None, "the engine stopped delivering"
            if result.is_finished():
                results[result.request_id] = result
    finally:
        manager.stop(block=True)
        manager.destroy()
    return results


def test_a_manager_with_labels_and_a_cancelled_request(sim_gpus: Any, engine: Engine) -> None:
    sim_gpus("H100", clock="real")
    manager = engine.model.init_continuous_batching(
        generation_config=engine.generation, continuous_batching_config=engine.cb_config(ROOMY)
    )
    tenants = {"a": "x", "b": "y", "c": "x"}
    # Cancelled from the engine's thread after exactly 3 decoded tokens.
    ledger = ActingLedger(
        manager, "c", 3, lambda: manager.cancel_request("c"), method="tokens", model="tiny"
    )
    tracker = ContinuousBatchingEnergy(
        ledger, labels_of=lambda state: {"tenant": tenants[state.request_id]}
    ).attach(manager)
    assert tracker.attach(manager) is tracker  # a second attach changes nothing
    requests = {
        rid: (prompt, 40 if rid == "c" else 6) for rid, prompt in zip(tenants, PROMPTS[2:5])
    }
    results = run_manager(manager, requests, finished=2)
    tracker.detach()
    ledger.close()

    assert tracker.errors == 0
    assert set(results) == {"a", "b"}
    records = {r.request_id: r for r in ledger.records}
    assert set(records) == {"a", "b", "c"}
    for rid in ("a", "b"):
        assert records[rid].finished and records[rid].output_tokens == 6
        assert records[rid].output_tokens == len(results[rid].generated_tokens)
    # The cancelled request is reported when the engine drops it, with what it generated.
    c = records["c"]
    assert c.finished and c.decode_tokens == 3 and c.output_tokens == 4
    assert {rid: r.labels for rid, r in records.items()} == {
        rid: {"tenant": t} for rid, t in tenants.items()
    }
    by_tenant = {a.labels["tenant"]: a.requests for a in ledger.aggregates()}
    assert by_tenant == {"x": 2, "y": 1}
    assert_conserved(ledger)
    assert ledger.open_requests == 0


def test_attach_rejects_other_objects_and_detach_restores(engine: Engine) -> None:
    ledger: Any = object()  # never called: nothing runs
    with pytest.raises(TypeError, match="cannot attach to int"):
        ContinuousBatchingEnergy(ledger).attach(3)
    manager = engine.model.init_continuous_batching(
        generation_config=engine.generation, continuous_batching_config=engine.cb_config(ROOMY)
    )
    try:
        with ContinuousBatchingEnergy(ledger).attach(engine.model) as tracker:
            assert "init_continuous_batching" in vars(engine.model)
            tracker.attach(manager)
            assert "_create_batch_processor" in vars(manager)
        assert "init_continuous_batching" not in vars(engine.model)
        assert "_create_batch_processor" not in vars(manager)
        tracker.detach()  # idempotent
    finally:
        manager.destroy()


def test_zeus_imports_without_transformers() -> None:
    code = (
        "import sys\n"
        "sys.modules['transformers'] = None\n"
        "from zeus.monitor.serving.transformers import ContinuousBatchingEnergy\n"
        "try:\n"
        "    ContinuousBatchingEnergy(None).attach(object())\n"
        "except ImportError:\n"
        "    print('ImportError')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ImportError"


def test_requests_failed_by_a_hard_stop_are_finished(sim_gpus: Any, engine: Engine) -> None:
    sim_gpus("H100", clock="real")
    manager = engine.model.init_continuous_batching(
        generation_config=engine.generation, continuous_batching_config=engine.cb_config(ROOMY)
    )
    status = manager.background_thread_status
    rank = manager.distributed_helper.global_rank

    def hard_stop() -> None:
        status.request_stop(status.HARD_STOP, rank)

    # The engine hard-stops (from its thread) once request `a` has decoded 2 tokens.
    ledger = ActingLedger(manager, "a", 2, hard_stop, method="tokens")
    tracker = track_continuous_batching(manager, ledger)
    requests = {rid: (prompt, 40) for rid, prompt in zip("abc", PROMPTS[2:5])}
    results = run_manager(manager, requests, finished=3)
    tracker.detach()
    assert all(r.error is not None for r in results.values())
    assert ledger.open_requests == 0  # every request that ran was finished when it failed
    ledger.close()

    assert tracker.errors == 0
    records = {r.request_id: r for r in ledger.records}
    assert "a" in records and set(records) <= set("abc")
    assert records["a"].decode_tokens == 2 and records["a"].output_tokens == 3
    for rid, r in records.items():
        assert r.finished and r.output_tokens == len(results[rid].generated_tokens)
    assert_conserved(ledger)


def test_a_failing_labels_of_costs_only_its_labels(
    sim_gpus: Any, engine: Engine, reference: dict[str, list[int]]
) -> None:
    sim_gpus("H100", clock="real")

    def labels_of(state: Any) -> dict[str, str]:
        if state.request_id == "req_0":
            raise KeyError(state.request_id)
        return {"prompt": str(len(state.initial_tokens))}

    with EnergyLedger(method="tokens") as ledger:
        with track_continuous_batching(engine.model, ledger, labels_of=labels_of) as tracker:
            out = engine.generate()
    assert out == reference
    assert tracker.errors == 1
    records = {r.request_id: r for r in ledger.records}
    assert set(records) == set(reference)
    assert records["req_0"].labels == {} and records["req_0"].finished
    assert records["req_3"].labels == {"prompt": str(len(PROMPTS[3]))}
    assert_conserved(ledger)


def test_requests_the_adapter_cannot_read_cost_only_their_accounting(
    sim_gpus: Any, engine: Engine, reference: dict[str, list[int]], monkeypatch: Any
) -> None:
    """A transformers whose request states the adapter cannot read (here: every read
    raises) generates the same tokens; the steps' energy goes to the residual, and the
    first error is logged and counted."""
    sim_gpus("H100", clock="real")

    def unreadable(self: Any, batch: Any, finished: Any) -> None:
        raise AttributeError("'RequestState' object has no attribute 'position_offset'")

    monkeypatch.setattr(_StepWork, "__init__", unreadable)
    with EnergyLedger(method="tokens") as ledger:
        with track_continuous_batching(engine.model, ledger) as tracker:
            out = engine.generate()
    assert out == reference
    assert tracker.errors > 0
    assert not ledger.records
    t = ledger.totals()
    assert t.measured > 0.0 and t.residual == pytest.approx(t.measured, rel=1e-9)
