"""`EnergyLedger`: the Python face of the Rust serving ledger (`zeus._core.monitor`)."""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

from zeus import _core
from zeus.monitor.energy import ZeusMonitor

Method = Literal["time", "tokens", "work"]


@dataclass(frozen=True)
class RequestEnergy:
    """The energy of one request.

    Attributes:
        request_id: The engine's id of the request.
        model: The model name it was served by.
        labels: User labels (tenant, adapter, ...) given at arrival.
        method: How step energy was split among requests (`time`, `tokens`, `work`).
        arrival: When it arrived (s, the GPUs' clock: Unix time on real GPUs).
        first_step: Start of the first engine step it ran in (NaN if it never ran).
        finish: When it finished (the ledger's close for an unfinished request).
        finished: False for a request still open when the ledger closed.
        energy: Its energy, J.
        energy_bound: The true energy lies within `energy ± energy_bound` (see
            `docs/serving-energy.md`: the measurement's bound plus, for `work`, what the
            fitted model's uncertainty allows its share to move).
        prefill_energy: The part spent in prefill, J.
        decode_energy: The part spent in decode, J.
        gpu_energy: Per GPU index, J (the split of a tensor-parallel engine).
        prefill_tokens: Prompt tokens processed.
        decode_tokens: Tokens processed in decode steps.
        output_tokens: Tokens generated (as the engine reported at finish, else counted).
        steps: Engine steps it ran in.
        mean_batch: Mean number of requests in those steps.
        fitted: `work` only: False if some of its steps were split by tokens because the
            model did not have enough data yet.

    """

    request_id: str
    model: str
    labels: dict[str, str]
    method: str
    arrival: float
    first_step: float
    finish: float
    finished: bool
    energy: float
    energy_bound: float
    prefill_energy: float
    decode_energy: float
    gpu_energy: dict[int, float]
    prefill_tokens: float
    decode_tokens: float
    output_tokens: float
    steps: int
    mean_batch: float
    fitted: bool

    @property
    def joules_per_output_token(self) -> float:
        """Energy per generated token, J (NaN for a request that generated none)."""
        return self.energy / self.output_tokens if self.output_tokens else float("nan")

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (one line of the ledger's log)."""
        d = asdict(self)
        d["gpu_energy"] = {str(k): v for k, v in self.gpu_energy.items()}
        d["joules_per_output_token"] = self.joules_per_output_token
        for k in ("first_step", "joules_per_output_token"):
            if d[k] != d[k]:  # NaN is not JSON
                d[k] = None
        return d


@dataclass(frozen=True)
class LedgerTotals:
    """The ledger's energy, J: `measured == requests + residual + pending`.

    Attributes:
        seconds: Time covered.
        steps: Engine steps with at least one request.
        measured: Energy measured over the whole time.
        requests: Attributed to requests (finished or not).
        residual: Spent with no request in a step (idle, scheduling between steps).
        residual_bound: The residual's bound.
        pending: Measured, not yet attributed (`work`: steps waiting for their span).

    """

    seconds: float
    steps: int
    measured: float
    requests: float
    residual: float
    residual_bound: float
    pending: float


@dataclass(frozen=True)
class WorkWeights:
    """The `work` method's fitted cost model.

    A stretch of serving of `T` s that processed `P` prefill and `D` decode tokens holding `K`
    KV-cache tokens costs `idle_w·T + prefill_j·P + decode_j·D + kv_w·K·T` J.

    Attributes:
        idle_w: Static power, W.
        prefill_j: J per prefill token.
        decode_j: J per decode token.
        kv_w: W per token held in KV caches.
        std_err: Standard errors of the four weights (inf where the data cannot tell).
        rms_j: Root-mean-square misfit of a span's energy, J.
        rms_rel: The same relative to the mean span energy.
        spans: Spans fitted.

    """

    idle_w: float
    prefill_j: float
    decode_j: float
    kv_w: float
    std_err: tuple[float, float, float, float]
    rms_j: float
    rms_rel: float
    spans: int


@dataclass
class Aggregate:
    """Finished requests of one model and label set.

    Attributes:
        model: The model name.
        labels: The labels.
        requests: How many.
        energy: Their energy, J, and its bound (the sum of theirs).
        prefill_energy: Their prefill part, J.
        decode_energy: Their decode part, J.
        prefill_tokens: Prompt tokens processed.
        output_tokens: Tokens generated.

    """

    model: str
    labels: dict[str, str]
    requests: int = 0
    energy: float = 0.0
    energy_bound: float = 0.0
    prefill_energy: float = 0.0
    decode_energy: float = 0.0
    prefill_tokens: float = 0.0
    output_tokens: float = 0.0

    @property
    def joules_per_output_token(self) -> float:
        """Energy per generated token over these requests, J (NaN before any)."""
        return self.energy / self.output_tokens if self.output_tokens else float("nan")


class EnergyLedger:
    """Energy per request in a continuously batched serving engine.

    The engine reports, from one thread: `arrive` (optional: a request first named in a step
    arrives then), `begin_step` (optional: without it, the time between steps counts in the
    next step), `end_step` with each request's work in the step, and `finish`. Records are
    delivered as their steps are attributed: to `callback`, to the JSON-lines `log_path`, and
    to `records` (the most recent `keep`).

    Example:
        ```python
        from zeus.monitor import ZeusMonitor
        from zeus.monitor.serving import EnergyLedger

        with EnergyLedger(ZeusMonitor(gpu_indices=[0]), model="llama-3-8b") as ledger:
            ledger.arrive("a", labels={"tenant": "x"})
            ledger.end_step(["a"], prefill_tokens=[512], decode_tokens=[0], kv_tokens=[512])
            ledger.end_step(["a"], prefill_tokens=[0], decode_tokens=[1], kv_tokens=[513])
            ledger.finish("a", output_tokens=2)
        print(ledger.records[0].energy, ledger.records[0].energy_bound)
        ```

    """

    def __init__(
        self,
        monitor: ZeusMonitor | None = None,
        *,
        method: Method = "work",
        model: str = "",
        gpu_indices: Sequence[int] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        callback: Callable[[RequestEnergy], None] | None = None,
        keep: int = 10_000,
        span_s: float = 1.0,
        min_spans: int = 8,
        max_wait_s: float = 30.0,
        defer_cuts: bool = True,
    ) -> None:
        """Start measuring.

        Args:
            monitor: The monitor whose GPUs serve (all of a tensor-parallel engine's GPUs);
                default: a new `ZeusMonitor(gpu_indices)`. The ledger opens a window of its
                own on it, cut at every step.
            method: `"time"` (equal shares of a step), `"tokens"` (shares of the tokens
                processed) or `"work"` (a per-token cost model fitted online; the default).
            model: The model name records and aggregates carry by default.
            gpu_indices: The GPUs when no `monitor` is given.
            log_path: A JSON-lines file that gets one line per record (appended).
            callback: Called with each record as it is ready (on the engine's thread).
            keep: How many recent records `records` keeps.
            span_s: `work`: the length of the spans the model is fitted on, s.
            min_spans: `work`: spans needed before the model's weights are used; steps wait
                until then (at most `max_wait_s`, then they are split by tokens).
            max_wait_s: `work`: see `min_spans`.
            defer_cuts: Where the monitor's window can be cut after the fact (every GPU read
                from the sampler's cache, no CPU in the monitor), the engine's calls only mark
                their moments, measured together every few steps (`deferred_cuts`): a
                fraction of the cost on the engine's thread, records up to a quarter second
                later. `False`: every call cuts at once.

        Raises:
            ValueError: An unknown method, a bad span, or a monitor with no GPU.

        """
        if monitor is None:
            monitor = ZeusMonitor(gpu_indices=gpu_indices)
        self.monitor = monitor
        self.model = model
        self._core = _core.monitor.EnergyLedger(
            monitor,
            method=method,
            span_s=span_s,
            min_spans=min_spans,
            max_wait_s=max_wait_s,
            defer=defer_cuts,
        )
        self.method: str = self._core.method
        self.gpu_indices: list[int] = list(self._core.gpu_indices)
        self.callback = callback
        self.records: deque[RequestEnergy] = deque(maxlen=keep)
        self._groups: dict[int, tuple[str, dict[str, str]]] = {0: (model, {})}
        self._group_ids: dict[str, int] = {}
        self._log: IO[str] | None = None
        if log_path is not None:
            path = Path(log_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._log = path.open("a", encoding="utf-8")
        self._closed = False

    def _group(self, model: str | None, labels: Mapping[str, str] | None) -> int:
        model = self.model if model is None else model
        if model == self.model and not labels:
            return 0
        clean = {str(k): str(v) for k, v in sorted((labels or {}).items())}
        key = json.dumps([model, clean])
        gid = self._group_ids.get(key)
        if gid is None:
            gid = self._core.group(key)
            self._group_ids[key] = gid
            self._groups[gid] = (model, clean)
        return gid

    def arrive(
        self,
        request_id: str,
        *,
        model: str | None = None,
        labels: Mapping[str, str] | None = None,
        at: float | None = None,
    ) -> None:
        """Request `request_id` arrived (at `at`, default now on the GPUs' clock).

        Raises:
            ValueError: The request is already open.

        """
        self._core.arrive(request_id, self._group(model, labels), at)

    def begin_step(self) -> None:
        """An engine step begins: the energy since the last step ended goes to the residual.

        With `deferred_cuts`, this only reads the clock: the window is cut at that moment
        later.
        """
        self._core.begin_step()

    def end_step(
        self,
        request_ids: Sequence[str],
        prefill_tokens: Sequence[float],
        decode_tokens: Sequence[float],
        kv_tokens: Sequence[float],
    ) -> None:
        """An engine step ended; its requests and what each did in it.

        Args:
            request_ids: The requests in the step (a request not seen before arrives now).
            prefill_tokens: Per request, prompt tokens processed in the step.
            decode_tokens: Per request, tokens decoded in the step.
            kv_tokens: Per request, tokens in its KV cache during the step.

        Raises:
            ValueError: Lengths differ, a request appears twice, a count is negative or not
                finite. The step's energy then goes to the residual: nothing measured is lost.

        """
        if self._core.end_step(request_ids, prefill_tokens, decode_tokens, kv_tokens):
            self._deliver()

    def finish(
        self, request_id: str, *, output_tokens: float | None = None, at: float | None = None
    ) -> None:
        """Request `request_id` finished.

        `output_tokens` is how many tokens it generated (default: counted from its steps, its
        decode tokens plus the one its prefill produced).

        Raises:
            ValueError: The request is not open.

        """
        if self._core.finish(request_id, output_tokens, at):
            self._deliver()

    def _deliver(self) -> None:
        raw = self._core.take_records()
        if not raw:
            return
        for d in raw:
            model, labels = self._groups.get(d.pop("group"), (self.model, {}))
            rec = RequestEnergy(model=model, labels=dict(labels), method=self.method, **d)
            self.records.append(rec)
            if self._log is not None:
                self._log.write(json.dumps(rec.to_json()) + "\n")
            if self.callback is not None:
                self.callback(rec)
        if self._log is not None:
            self._log.flush()

    def flush(self) -> None:
        """Attribute every step measured so far and deliver finished requests' records.

        `work` splits them with the model fitted so far, or by tokens before it has enough data.
        """
        self._core.flush(False)
        self._deliver()

    def totals(self) -> LedgerTotals:
        """The energy measured, attributed, residual and pending so far."""
        t = self._core.totals()
        return LedgerTotals(**t)

    def weights(self) -> WorkWeights | None:
        """The `work` model's fitted weights (None before the first fit, or for other methods)."""
        w = self._core.weights()
        if w is None:
            return None
        w["std_err"] = tuple(w["std_err"])
        return WorkWeights(**w)

    def aggregates(self) -> list[Aggregate]:
        """Totals of finished requests per model and label set."""
        out = []
        for gid, (_, g) in enumerate(self._core.groups()):
            if not g["requests"]:
                continue
            model, labels = self._groups.get(gid, (self.model, {}))
            out.append(Aggregate(model=model, labels=dict(labels), **g))
        return out

    @property
    def deferred_cuts(self) -> bool:
        """Whether the engine's calls only mark their moments, measured every few steps.

        `begin_step`, `end_step` and `finish` then record when they happened (and what the
        step did), and the monitor's window is cut at those moments together, once 8 steps or
        a quarter second have gone by, by the ledger's own thread (or by the engine's call
        that finds them overdue, or when anything reads the ledger): the engine's thread does
        not enter the monitor at all, where it used to twice a step with its caches cold.
        Records are ready that much later. It needs `defer_cuts`, every GPU read from
        the sampler's cache and no CPU in the monitor; otherwise every call cuts at once.
        """
        return self._core.deferred_cuts

    @property
    def open_requests(self) -> int:
        """Requests arrived and not yet reported."""
        return self._core.open_requests()

    def close(self) -> LedgerTotals:
        """Stop measuring; idempotent.

        The energy since the last step goes to the residual, every step is attributed,
        requests still open are reported with `finished=False`, and the log is closed.
        """
        if not self._closed:
            self._closed = True
            try:
                self._core.close()
                self._deliver()
            finally:
                if self._log is not None:
                    self._log.close()
                    self._log = None
        return self.totals()

    def __enter__(self) -> EnergyLedger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
