"""Per-request energy of a vLLM engine (V1), through a custom stat logger.

`zeus_stat_logger(ledger)` returns a subclass of vLLM's `StatLoggerBase` that reports every
engine step to an `EnergyLedger`. vLLM instantiates stat loggers itself, with
`(vllm_config, engine_index)`, so the ledger is bound when the class is made:

```python
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM
from zeus.monitor import ZeusMonitor
from zeus.monitor.serving import EnergyLedger
from zeus.monitor.serving.vllm import zeus_stat_logger

ledger = EnergyLedger(ZeusMonitor(gpu_indices=[0]), model="llama-3-8b")
ZeusLogger = zeus_stat_logger(ledger, callback=lambda r: print(r.request_id, r.energy))
engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=...), stat_loggers=[ZeusLogger])
...
ledger.close()
records = ZeusLogger.loggers[0].records  # vLLM's request ids
```

`LLMEngine.from_engine_args(args, stat_loggers=[ZeusLogger])` works the same (stats must be on:
`disable_log_stats=False`, `EngineArgs`' default; the offline `LLM` class takes no stat
loggers). `vllm serve` loads stat loggers from the entry-point group
`vllm.stat_logger_plugins` (a `StatLoggerBase` subclass, AsyncLLM only); give it a class made
at import time from a ledger factory, `zeus_stat_logger(lambda engine_index: EnergyLedger(...))`,
so that the ledger starts when vLLM makes the logger. With data parallelism vLLM makes one
logger per engine: pass a factory, one ledger (with that engine's GPUs) per engine index.

## What vLLM tells a stat logger

Read from vLLM 0.33.0 (its modules `vllm.v1.metrics.loggers`, `vllm.v1.metrics.stats`,
`vllm.v1.engine.async_llm`, `vllm.v1.engine.llm_engine`, `vllm.v1.engine.output_processor`).
`record(scheduler_stats, iteration_stats, mm_cache_stats, engine_idx)` runs in the frontend
process (AsyncLLM's output handler, `LLMEngine.step`) once per `EngineCoreOutputs` received,
i.e. once per engine step when stats are on, after the step's outputs were processed. It
carries:

- `IterationStats` (None for a step with no request output): the step's totals,
  `num_generation_tokens` and prompt tokens (`prompt_token_stats.computed`/`.total`; counted in
  the step that completes a request's prefill and gives its first token); one
  `time_to_first_tokens_iter` entry per request whose first token came in the step
  (`iteration_timestamp - arrival_time`); and `finished_requests`, per request its id (the
  one the caller gave), `e2e_latency` (`iteration_timestamp - arrival_time`), prompt and
  generated token counts.
- `SchedulerStats`: counts of running and waiting requests, KV cache usage.

No request is named before it finishes: there is no per-request work per step.

## How steps are attributed

Each request is tracked from the step of its first token, under a placeholder id
(`vllm-<engine>-<n>`), keyed by its arrival time, which both `iteration_timestamp - ttft` and,
at finish, `iteration_timestamp - e2e_latency` give back exactly (Unix times within a factor of
two of each other subtract exactly, and so does taking the difference back off). Each step
with outputs is one `ledger.end_step` over the tracked requests:

- the requests whose first token came in the step split its prompt tokens equally (prefill:
  the computed ones; KV: all of them), and get no decode token;
- the others split `num_generation_tokens` minus the new requests equally as decode tokens,
  with `prompt + generated so far` KV tokens.

A finished request is matched to its placeholder by arrival time, and
`ledger.finish(placeholder, output_tokens=num_generation_tokens)` closes it. Records come back
through the ledger's callback (which the logger wraps; a callback set before it still gets
every record): the logger's `records` and `callback` carry vLLM's request id, the ledger's own
`records`, log and callback the placeholder. Conservation is the ledger's own: every step's
energy goes to the tracked requests or, with none, to the residual.

## Limits

It has run against vLLM 0.33.0's own stats classes and `OutputProcessor` (the frontend code
that fills `IterationStats`), fed recorded engine outputs on the simulated GPU; it has not run
against a live vLLM engine on a GPU.

- Per-request work within a step is estimated: new requests of one step share its prompt
  tokens equally, running ones its decode tokens. A record's prompt tokens are right when it
  was the only request to start in its step, its decode tokens when every running request
  gives one token a step (no speculative decoding, no preemption); its `output_tokens` is
  always vLLM's count. KV tokens are prompt plus tokens generated, not the cache's blocks.
- A chunked prefill's earlier chunks give no output: their energy goes to the requests
  decoding alongside (or, with none, into the step that completes the prefill). A prefill that
  did not finish is never seen.
- Steps are cut when the frontend records them, after the engine's output crossed to it, not
  at the GPU's step boundary; the energy between two records goes to the second's requests.
- The energy of an idle stretch goes to the first step after it, except what `log()` (called
  every `VLLM_LOG_STATS_INTERVAL` s by vLLM's servers) cuts off to the residual while the
  engine is idle; the engine's start-up goes to the residual (`log_engine_initialized`).
- A preempted request stays tracked (and charged its share) while it waits.
- A request aborted by the client (a disconnect) gets no finished stats. When the scheduler
  holds fewer requests (after the step, plus those that finished in it) than are tracked, the
  longest-tracked ones are dropped before the step: a guess at which ones left. They stay open
  in the ledger and are reported at close as unfinished, under their placeholder ids
  (`dropped` counts them). A finished request that was never tracked (aborted before its first
  token) gets a record with no step and no energy (`untracked` counts them).
- With `n > 1` every sample is a request; they share the caller's id.
- Streaming-input sessions (a request resumed with new input) and several API server
  processes (each sees part of the stats) are not supported.
- `record` never raises (an exception would stop vLLM's output handler): a failure is logged
  once and counted in `errors`. Nothing measured is lost: a step the ledger refuses goes to its
  residual, a step never reported into the next one.

vLLM is imported only by `zeus_stat_logger`.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, Optional, Union, cast

from zeus.monitor.serving.ledger import EnergyLedger, RequestEnergy
from zeus.util.logging import get_logger

__all__ = ["ZeusStatLogger", "zeus_stat_logger"]

logger = get_logger(__name__)

LedgerSource = Union[EnergyLedger, Callable[[int], EnergyLedger]]
"""A ledger, or a function of the engine index that makes one."""

_LOGGERS = "vllm.v1.metrics.loggers"
_MATCH_TOL_S = 1e-3
"""A finished request's arrival time not found exactly matches the nearest one this close."""


class _Tracked:
    __slots__ = ("arrival", "generated", "prompt")

    def __init__(self, arrival: float, prompt: float, generated: float) -> None:
        self.arrival = arrival
        self.prompt = prompt
        self.generated = generated


def _prompt_tokens(stats: Any) -> tuple[float, float]:
    """A step's prompt tokens: (all, computed), from either layout of `IterationStats`."""
    pts = getattr(stats, "prompt_token_stats", None)
    if pts is not None:
        return float(pts.total), float(pts.computed)
    n = float(getattr(stats, "num_prompt_tokens", 0) or 0)
    return n, n


def _served_model_name(vllm_config: Any) -> str | None:
    mc = getattr(vllm_config, "model_config", None)
    name = getattr(mc, "served_model_name", None) or getattr(mc, "model", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    return str(name) if name else None


class ZeusStatLogger:
    """Reports a vLLM engine's steps, read from its stat logger calls, to an `EnergyLedger`.

    This class has vLLM's stat logger methods but not its base class; `zeus_stat_logger`
    makes the subclass vLLM takes. See the module's docstring for how steps are attributed.

    Attributes:
        ledger: The ledger.
        engine_index: The engine whose records this logger takes.
        model: The model name requests arrive with (None: the ledger's).
        callback: Called with each record, with vLLM's request id.
        records: The most recent records (`keep`), with vLLM's request ids.
        dropped: Tracked requests dropped because the scheduler no longer counted them.
        untracked: Finished requests never seen running (a record with no energy).
        errors: Calls that raised (the first of each kind is logged).
        loggers: On the classes `zeus_stat_logger` makes: each engine index's instance.

    """

    loggers: ClassVar[dict[int, ZeusStatLogger]] = {}

    def __init__(
        self,
        ledger: EnergyLedger,
        *,
        engine_index: int = 0,
        model: str | None = None,
        callback: Callable[[RequestEnergy], None] | None = None,
        keep: int = 10_000,
    ) -> None:
        """Bind to `ledger`; wraps its callback so that records come back with vLLM's ids.

        Args:
            ledger: The ledger (its monitor measures this engine's GPUs).
            engine_index: vLLM's index of the engine (data parallelism).
            model: The model name requests arrive with (None: the ledger's).
            callback: Called with each record, with vLLM's request id.
            keep: How many recent records `records` keeps.

        """
        self.ledger = ledger
        self.engine_index = engine_index
        self.model = model
        self.callback = callback
        self.records: deque[RequestEnergy] = deque(maxlen=keep)
        self.dropped = 0
        self.untracked = 0
        self.errors = 0
        self._prefix = f"vllm-{engine_index}-"
        self._seq = 0
        self._running: dict[str, _Tracked] = {}  # placeholder -> request, first token order
        self._by_arrival: dict[float, list[str]] = {}
        self._names: dict[str, str] = {}  # placeholder -> vLLM id, until the record is out
        self._in_engine = 0  # requests the scheduler counted last
        self._logged: set[str] = set()
        self._chained = ledger.callback
        ledger.callback = self._on_record

    # vLLM's StatLoggerBase methods.

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        """One engine step's stats (`SchedulerStats`, `IterationStats`, either may be None)."""
        if engine_idx != self.engine_index:
            return
        try:
            self._record(scheduler_stats, iteration_stats)
        except Exception as e:  # a raising logger would stop vLLM's output handler
            self._error("record", e)

    def log_engine_initialized(self) -> None:
        """The engine is up: what was measured so far (loading, warm-up) goes to the residual."""
        try:
            self._gap()
        except Exception as e:
            self._error("log_engine_initialized", e)

    def log(self) -> None:
        """The periodic call: while the engine is idle, its energy so far goes to the residual."""
        try:
            if self._idle():
                self._gap()
        except Exception as e:
            self._error("log", e)

    def record_sleep_state(self, is_awake: int = 0, level: int = 0) -> None:
        """The engine sleeps or wakes: nothing to report."""

    # The work.

    @property
    def running(self) -> int:
        """Requests tracked as running."""
        return len(self._running)

    def _idle(self) -> bool:
        return not self._running and self._in_engine == 0

    def _gap(self) -> None:
        self.ledger.end_step([], [], [], [])

    def _record(self, sched: Any, stats: Any) -> None:
        has_output = stats is not None and bool(
            stats.time_to_first_tokens_iter
            or stats.num_generation_tokens
            or stats.finished_requests
        )
        if sched is not None:
            self._in_engine = (
                int(sched.num_running_reqs)
                + int(sched.num_waiting_reqs)
                + int(getattr(sched, "num_skipped_waiting_reqs", 0) or 0)
            )
            # Requests the engine holds after the step, or finished in it: the tracked ones
            # and the new ones are among them (more when some have not given a token yet).
            bound = self._in_engine + (len(stats.finished_requests) if has_output else 0)
            new = len(stats.time_to_first_tokens_iter) if has_output else 0
            excess = len(self._running) + new - bound
            if excess > 0:
                self._drop(excess)
        if not has_output:
            # A step with only prefill chunks (its energy goes to the next step with outputs),
            # or nothing in the engine (to the residual).
            if self._idle():
                self._gap()
            return
        ts = float(stats.iteration_timestamp)
        self._step(stats, ts)
        for f in stats.finished_requests:
            self._finish(f, ts)

    def _open(self, arrival: float) -> str:
        ph = f"{self._prefix}{self._seq}"
        self._seq += 1
        self.ledger.arrive(ph, model=self.model, at=arrival if math.isfinite(arrival) else None)
        return ph

    def _step(self, stats: Any, ts: float) -> None:
        arrivals = [ts - float(t) for t in stats.time_to_first_tokens_iter]
        n_new = len(arrivals)
        prompt_all, prompt_computed = _prompt_tokens(stats)
        extra = max(float(stats.num_generation_tokens) - n_new, 0.0)
        ids: list[str] = []
        prefill: list[float] = []
        decode: list[float] = []
        kv: list[float] = []
        per_old = extra / len(self._running) if self._running else 0.0
        for ph, r in self._running.items():
            ids.append(ph)
            prefill.append(0.0)
            decode.append(per_old)
            kv.append(r.prompt + r.generated)
            r.generated += per_old
        if n_new:
            per_new = 0.0 if self._running else extra / n_new
            for arrival in arrivals:
                ph = self._open(arrival)
                r = _Tracked(arrival, prompt_all / n_new, 1.0 + per_new)
                self._running[ph] = r
                self._by_arrival.setdefault(arrival, []).append(ph)
                ids.append(ph)
                prefill.append(prompt_computed / n_new)
                decode.append(per_new)
                kv.append(r.prompt)
        if ids:
            self.ledger.end_step(ids, prefill, decode, kv)
        else:
            self._gap()

    def _match(self, arrival: float) -> str | None:
        phs = self._by_arrival.get(arrival)
        if phs is None:
            best = min(self._by_arrival, key=lambda a: abs(a - arrival), default=None)
            if best is None or not abs(best - arrival) <= _MATCH_TOL_S:
                return None
            arrival, phs = best, self._by_arrival[best]
        ph = phs.pop(0)
        if not phs:
            del self._by_arrival[arrival]
        return ph

    def _finish(self, f: Any, ts: float) -> None:
        arrival = ts - float(f.e2e_latency)
        ph = self._match(arrival)
        if ph is None:
            self.untracked += 1
            ph = self._open(arrival)
        else:
            del self._running[ph]
        rid = getattr(f, "request_id", None)
        self._names[ph] = ph if rid is None else str(rid)
        self.ledger.finish(ph, output_tokens=float(f.num_generation_tokens))

    def _drop(self, n: int) -> None:
        """Stop tracking the `n` longest-tracked requests (aborted: vLLM no longer holds them)."""
        for ph in list(self._running)[:n]:
            r = self._running.pop(ph)
            phs = self._by_arrival.get(r.arrival, [])
            if ph in phs:
                phs.remove(ph)
                if not phs:
                    del self._by_arrival[r.arrival]
            self.dropped += 1

    def _on_record(self, rec: RequestEnergy) -> None:
        try:
            name = self._names.pop(rec.request_id, None)
            if name is not None or rec.request_id.startswith(self._prefix):
                out = rec if name is None else dataclasses.replace(rec, request_id=name)
                self.records.append(out)
                if self.callback is not None:
                    try:
                        self.callback(out)
                    except Exception as e:  # the ledger's other records still go out
                        self._error("callback", e)
        finally:
            if self._chained is not None:
                self._chained(rec)

    def _error(self, where: str, e: Exception) -> None:
        self.errors += 1
        if where not in self._logged:
            self._logged.add(where)
            logger.warning("zeus vLLM stat logger: %s failed (logged once): %r", where, e)


def zeus_stat_logger(
    ledger: LedgerSource,
    *,
    callback: Callable[[RequestEnergy], None] | None = None,
    keep: int = 10_000,
) -> type[ZeusStatLogger]:
    """A vLLM stat logger class (a `StatLoggerBase` subclass) bound to `ledger`.

    Pass the class in `stat_loggers=[...]` to `AsyncLLM.from_engine_args` or
    `LLMEngine.from_engine_args`, or name it in the `vllm.stat_logger_plugins` entry-point
    group. vLLM makes one instance per engine, with `(vllm_config, engine_index)`; the class's
    `loggers` maps each engine index to its instance.

    Args:
        ledger: The ledger; or, to make it when vLLM makes the logger (one per engine with data
            parallelism), a function of the engine index that returns one.
        callback: Called with each record, with vLLM's request id.
        keep: How many recent records each logger's `records` keeps.

    Returns:
        The class. Requests arrive with the ledger's model name, or when it has none, vLLM's
        served model name.

    Raises:
        ImportError: vLLM (with the V1 engine's stat loggers) is not installed.

    """
    try:
        base = importlib.import_module(_LOGGERS).StatLoggerBase
    except (ImportError, AttributeError) as e:
        raise ImportError(f"zeus_stat_logger needs vLLM's V1 stat loggers ({_LOGGERS})") from e
    make: Callable[[int], EnergyLedger] | None = (
        None if isinstance(ledger, EnergyLedger) else ledger
    )
    fixed: Optional[EnergyLedger] = ledger if isinstance(ledger, EnergyLedger) else None

    def __init__(self: ZeusStatLogger, vllm_config: Any, engine_index: int = 0) -> None:
        loggers = type(self).loggers
        if make is not None:
            led = make(engine_index)
        else:
            assert fixed is not None
            other = [i for i, lg in loggers.items() if i != engine_index and lg.ledger is fixed]
            if other:
                raise ValueError(
                    f"engine {engine_index}: the ledger already serves engine {other[0]}; "
                    "pass a function of the engine index that makes one ledger per engine"
                )
            led = fixed
        model = None if led.model else _served_model_name(vllm_config)
        ZeusStatLogger.__init__(
            self, led, engine_index=engine_index, model=model, callback=callback, keep=keep
        )
        self.vllm_config = vllm_config  # type: ignore[attr-defined]
        loggers[engine_index] = self

    namespace: dict[str, Any] = {
        "__init__": __init__,
        "__doc__": "vLLM stat logger reporting each engine step to a Zeus `EnergyLedger`.",
        "__module__": __name__,
        "loggers": {},
    }
    return cast(
        "type[ZeusStatLogger]", type("ZeusVllmStatLogger", (ZeusStatLogger, base), namespace)
    )
