"""Per-request energy of Hugging Face transformers' continuous batching.

`track_continuous_batching(target, ledger)` reports every engine step of a model's (or one
manager's) continuous batching to an `EnergyLedger`, without changing what the engine
generates. It works on `model.generate_batch`, on `model.init_continuous_batching()` managers
and on `model.continuous_batching_context_manager()`:

```python
from zeus.monitor.serving import EnergyLedger
from zeus.monitor.serving.transformers import track_continuous_batching

with EnergyLedger(model="llama-3-8b") as ledger:
    with track_continuous_batching(model, ledger):
        outputs = model.generate_batch(prompts, generation_config=config)
for record in ledger.records:
    print(record.request_id, record.energy, record.joules_per_output_token)
```

transformers is imported only when something is attached.
"""

from __future__ import annotations

import importlib
import weakref
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Optional

from zeus.monitor.serving.ledger import EnergyLedger
from zeus.util.logging import get_logger

__all__ = ["ContinuousBatchingEnergy", "LabelsOf", "track_continuous_batching"]

logger = get_logger(__name__)

LabelsOf = Callable[[Any], Optional[Mapping[str, str]]]
"""Labels of a request, given its transformers `RequestState` (`.request_id`, prompt, ...)."""

_API = "transformers.generation.continuous_batching.continuous_api"
_REQUESTS = "transformers.generation.continuous_batching.requests"
_MISSING = object()


def _output_tokens(state: Any) -> int:
    """Tokens a request generated, as its `GenerationOutput` counts them.

    A request that was soft-reset (pushed out of a full cache) carries its earlier tokens in its
    prompt.
    """
    n = len(state.generated_tokens)
    true_initial = getattr(state, "_true_initial_tokens", 0)
    if true_initial:
        n += len(state.initial_tokens) - true_initial
    return n


def _batch_of(io: Any) -> list[Any]:
    """The `FutureRequestState`s of the batch `update_batch` is about to update."""
    pairs = getattr(io, "io_pairs", None)
    if pairs is not None:  # async batching: the pair whose outputs come back now
        return pairs[io.current_pair].host_io.requests_in_batch
    batch = getattr(io, "requests_in_batch", None)
    if batch is not None:
        return batch
    return io.prepare_batch_update()[0]


class _StepWork:
    """The requests of one batch and each one's work in it, as `EnergyLedger.end_step` takes them.

    A request that has generated nothing yet prefills its query tokens, the others decode
    them; its KV tokens are its position after the step.
    """

    __slots__ = ("decode", "ids", "kv", "prefill", "states")

    def __init__(self, batch: list[Any], finished: int | None) -> None:
        """Read `batch` (`FutureRequestState`s).

        Requests at or past status `finished` are skipped (async: finished in the batch
        before; their work here is waste). `None`: a batch just scheduled, which has none
        (and `status`, a property, is a call per request: a third of the reads' cost).
        """
        self.ids: list[str] = []
        self.prefill: list[int] = []
        self.decode: list[int] = []
        self.kv: list[int] = []
        self.states: list[Any] = []
        for future in batch:
            state = future.state
            if finished is not None and state.status >= finished:
                continue
            self.ids.append(state.request_id)
            q = future.query_length
            if state.generated_tokens:
                self.prefill.append(0)
                self.decode.append(q)
            else:
                self.prefill.append(q)
                self.decode.append(0)
            self.kv.append(state.position_offset)
            self.states.append(state)


class _Live:
    """Whether the hooks of one attachment report (cleared by `detach`)."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False


class _Steps:
    """Per batch processor: batches in flight, the last one's work, cancelled requests.

    `pending` counts batches scheduled and not yet updated; `scheduled` is the work of the
    batch scheduled last, read when it was scheduled (sync batching only). `finished` holds
    the states the scheduler was told to finish during the update under way (`updating`),
    where its `finish_request` is hooked (`watching`).
    """

    __slots__ = ("cancelled", "finished", "pending", "scheduled", "updating", "watching")

    def __init__(self) -> None:
        self.pending = 0
        self.scheduled: _StepWork | None = None
        self.cancelled: list[Any] = []
        self.finished: list[Any] = []
        self.updating = False
        self.watching = False


class ContinuousBatchingEnergy:
    """Reports transformers' continuous batching steps to an `EnergyLedger`.

    Hooks (set on the instances, never on transformers' classes, and removed by `detach`):

    - the model's `init_continuous_batching` (through which `generate_batch` and
      `continuous_batching_context_manager` make their manager): each manager it returns is
      attached;
    - the manager's `_create_batch_processor` (called when warming up or starting): each batch
      processor it returns is attached;
    - the batch processor's `prepare_next_batch`: once a batch is scheduled on an idle engine,
      `ledger.begin_step()`, so that the time between steps (waiting for requests, scheduling)
      goes to the ledger's residual; then (sync batching) each request's work in the batch
      (prompt tokens while it has generated nothing yet, else decode tokens: the step's query
      length; KV tokens: its position after the step), read while the engine's own walk over
      the batch left it in cache (async batching: when the batch is updated);
    - its `update_batch`: after the original, `ledger.end_step(...)` with that work and
      `ledger.finish(...)` for each request that finished, with the tokens it generated: those
      the update passed to its scheduler's `finish_request` (hooked; no walk over the batch's
      states, which after the forward pass costs the engine's thread a cache miss each), else
      those whose status says so;
    - its `_handle_request_error` and its scheduler's `clear_cancelled_requests`: failed and
      cancelled requests are finished too (with the tokens generated so far).

    Every ledger call runs on the engine's generation thread, so the ledger sees one thread.
    A ledger error never stops generation: it is logged once and counted in `errors`.

    Async batching (`use_async_batching`, CUDA only): batch N+1 is scheduled and launched
    before batch N's results come back, so `begin_step` is called only when no batch is in
    flight, and each step runs from one batch's update to the next: a step's energy is that of
    the GPU while the batch being updated finished computing (and the next one started). A
    request that finished in batch N is not charged for batch N+1's wasted work on it; its KV
    tokens may include the tokens of the batch scheduled after it.

    Attributes:
        ledger: The ledger.
        labels_of: See `__init__`.
        errors: Ledger calls that raised (the first is logged).

    """

    def __init__(self, ledger: EnergyLedger, *, labels_of: LabelsOf | None = None) -> None:
        """Set up; nothing is hooked before `attach`.

        Args:
            ledger: The ledger the steps go to.
            labels_of: Called with a request's `RequestState` when it first runs in a step;
                the labels (tenant, adapter, ...) its record and aggregate carry. `None`: no
                labels (the request arrives when it first runs, with the ledger's model).

        """
        self.ledger = ledger
        self.labels_of = labels_of
        self.errors = 0
        self._live = _Live()
        self._patches: list[tuple[weakref.ref[Any], str, Any, Any]] = []
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()
        self._steps: weakref.WeakKeyDictionary[Any, _Steps] = weakref.WeakKeyDictionary()
        self._labelled: set[str] = set()
        self._finished = 3  # RequestStatus.FINISHED; read from transformers at attach

    @property
    def attached(self) -> bool:
        """Whether the hooks are in place."""
        return self._live.on

    def attach(self, target: Any) -> ContinuousBatchingEnergy:
        """Hook a model, a `ContinuousBatchingManager` or a `ContinuousBatchProcessor`.

        A model is hooked for every manager it makes from now on (and the cached one it
        returns); a manager for every batch processor it makes (and the one it holds). Attach
        before the manager starts: a step already under way when a hook lands is reported in
        part or not at all. Attaching the same object again does nothing.

        Args:
            target: The object to hook.

        Returns:
            This object, so that `with ContinuousBatchingEnergy(ledger).attach(model):` works.

        Raises:
            ImportError: transformers (with continuous batching) is not installed.
            TypeError: `target` is none of the above.

        """
        api = importlib.import_module(_API)
        self._finished = int(importlib.import_module(_REQUESTS).RequestStatus.FINISHED)
        hook: Callable[[Any], None]
        if isinstance(target, api.ContinuousBatchProcessor):
            hook = self._attach_processor
        elif isinstance(target, api.ContinuousBatchingManager):
            hook = self._attach_manager
        elif callable(getattr(target, "init_continuous_batching", None)):
            hook = self._attach_model
        else:
            raise TypeError(
                f"cannot attach to {type(target).__name__}: expected a model with continuous "
                "batching, a ContinuousBatchingManager or a ContinuousBatchProcessor"
            )
        self._live.on = True
        hook(target)
        return self

    def detach(self) -> None:
        """Remove every hook (restoring what was there before). Idempotent.

        Detach after the engine stopped (`generate_batch` returned, `manager.stop()`): a step
        under way when its hook is removed is not reported, and its energy goes to the residual.
        """
        # Hooks that stay (patched over by someone else) pass through from now on.
        self._live.on = False
        self._live = _Live()
        for ref, name, wrapper, previous in reversed(self._patches):
            obj = ref()
            if obj is None or vars(obj).get(name) is not wrapper:
                continue  # gone, or patched again over ours
            if previous is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, previous)
        self._patches.clear()
        self._seen = weakref.WeakSet()
        self._steps = weakref.WeakKeyDictionary()

    def __enter__(self) -> ContinuousBatchingEnergy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.detach()

    # ---- hooks -----------------------------------------------------------------------------

    def _patch(self, obj: Any, name: str, make: Callable[[Callable[..., Any]], Any]) -> None:
        """Set `obj.name` to `make(original)` on the instance.

        The original is called through a weak reference, so the hook makes no reference cycle
        through `obj` (a batch processor holds the KV cache).
        """
        previous = vars(obj).get(name, _MISSING)
        if previous is _MISSING:
            function = getattr(type(obj), name)
            ref = weakref.ref(obj)

            def original(*args: Any, **kwargs: Any) -> Any:
                return function(ref(), *args, **kwargs)

        else:
            original = previous
        wrapper = make(original)
        setattr(obj, name, wrapper)
        if len(self._patches) >= 256:  # a manager per `generate_batch`: forget the dead ones
            self._patches = [p for p in self._patches if p[0]() is not None]
        self._patches.append((weakref.ref(obj), name, wrapper, previous))

    def _attach_model(self, model: Any) -> None:
        if model in self._seen:
            return
        self._seen.add(model)
        live = self._live

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def init_continuous_batching(*args: Any, **kwargs: Any) -> Any:
                manager = original(*args, **kwargs)
                if live.on:
                    self._attach_manager(manager)
                return manager

            return init_continuous_batching

        self._patch(model, "init_continuous_batching", make)

    def _attach_manager(self, manager: Any) -> None:
        if manager in self._seen:
            return
        self._seen.add(manager)
        live = self._live

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def _create_batch_processor(*args: Any, **kwargs: Any) -> Any:
                processor = original(*args, **kwargs)
                if live.on:
                    self._attach_processor(processor)
                return processor

            return _create_batch_processor

        self._patch(manager, "_create_batch_processor", make)
        if getattr(manager, "batch_processor", None) is not None:
            self._attach_processor(manager.batch_processor)

    def _attach_processor(self, processor: Any) -> None:
        steps = self._steps.get(processor)
        if steps is not None:
            steps.pending = 0  # a processor handed out again has been reset
            return
        steps = self._steps[processor] = _Steps()
        live = self._live
        is_async = bool(getattr(processor, "use_async_batching", False))
        ledger = self.ledger
        finished = self._finished
        proc_ref = weakref.ref(processor)

        def make_prepare(original: Callable[[], bool]) -> Callable[[], bool]:
            def prepare_next_batch() -> bool:
                ready = original()
                if not live.on:
                    return ready
                idle = steps.pending == 0 or not is_async
                steps.scheduled = None
                try:
                    if idle and steps.cancelled:
                        self._finish_cancelled(steps)
                    if ready:
                        if idle:
                            ledger.begin_step()
                        steps.pending += 1
                        # Sync batching: read the batch now, while the engine has just walked
                        # its requests' states: after the forward pass, with caches cold, the
                        # same reads cost several times more. A forward pass changes no
                        # request's state, so the update sees these same values.
                        proc = None if is_async else proc_ref()
                        batch = getattr(proc and proc.inputs_and_outputs, "requests_in_batch", None)
                        if batch is not None:
                            steps.scheduled = _StepWork(batch, None)
                except Exception:
                    self._error()
                return ready

            return prepare_next_batch

        def make_update(original: Callable[[], None]) -> Callable[[], None]:
            def update_batch() -> None:
                if not live.on:
                    return original()
                work, steps.scheduled = steps.scheduled, None
                if work is None:  # async batching, or attached after the batch was scheduled
                    try:
                        proc = proc_ref()
                        batch = _batch_of(proc.inputs_and_outputs) if proc is not None else []
                        work = _StepWork(batch, finished)
                    except Exception:  # unread, the step's energy goes to the residual
                        self._error()
                steps.updating = True
                try:
                    original()
                finally:
                    steps.updating = False
                steps.pending = max(steps.pending - 1, 0)
                try:
                    done: list[Any] = []
                    if steps.watching:
                        done, steps.finished = steps.finished, done
                    if work is not None:
                        if self.labels_of is not None:
                            self._arrive(work.states)
                        ledger.end_step(work.ids, work.prefill, work.decode, work.kv)
                        if not steps.watching:
                            done = [state for state in work.states if state.status >= finished]
                    for state in done:
                        # The scheduler also lets go of requests it swaps out or resets: only a
                        # finished one is finished here.
                        if state.status >= finished:
                            self._finish(state)
                    if steps.cancelled and (steps.pending == 0 or not is_async):
                        self._finish_cancelled(steps)
                except Exception:
                    self._error()

            return update_batch

        def make_error(original: Callable[..., None]) -> Callable[..., None]:
            def _handle_request_error(error: Exception, state: Any) -> None:
                original(error, state)
                if live.on:
                    try:
                        self._finish(state)
                    except Exception:
                        self._error()

            return _handle_request_error

        self._patch(processor, "prepare_next_batch", make_prepare)
        self._patch(processor, "update_batch", make_update)
        self._patch(processor, "_handle_request_error", make_error)
        scheduler = getattr(processor, "scheduler", None)
        if scheduler is not None and hasattr(scheduler, "clear_cancelled_requests"):

            def make_cancel(original: Callable[[], list[Any]]) -> Callable[[], list[Any]]:
                def clear_cancelled_requests() -> list[Any]:
                    cancelled = original()
                    if cancelled and live.on:
                        # Finished once no batch that may hold them is in flight.
                        steps.cancelled.extend(cancelled)
                    return cancelled

                return clear_cancelled_requests

            self._patch(scheduler, "clear_cancelled_requests", make_cancel)
        active = getattr(scheduler, "active_requests", None)
        if callable(getattr(scheduler, "finish_request", None)) and isinstance(active, dict):
            sched_ref = weakref.ref(scheduler)

            def make_finish_request(original: Callable[[str], None]) -> Callable[[str], None]:
                def finish_request(request_id: str) -> None:
                    sched = sched_ref() if steps.updating and live.on else None
                    state = None if sched is None else sched.active_requests.get(request_id)
                    original(request_id)
                    if state is not None:
                        steps.finished.append(state)

                return finish_request

            self._patch(scheduler, "finish_request", make_finish_request)
            steps.watching = True

    # ---- ledger calls (on the generation thread) ------------------------------------------

    def _arrive(self, states: list[Any]) -> None:
        labels_of = self.labels_of
        assert labels_of is not None
        for state in states:
            rid = state.request_id
            if rid not in self._labelled:
                self._labelled.add(rid)
                try:
                    self.ledger.arrive(rid, labels=labels_of(state))
                except Exception:  # a bad label must not cost the step its accounting
                    self._error()

    def _finish(self, state: Any) -> None:
        """Finish `state`'s request.

        Nothing happens if the ledger does not hold it open (it never ran in a step, or it
        finished already).
        """
        self._labelled.discard(state.request_id)
        try:
            self.ledger.finish(state.request_id, output_tokens=_output_tokens(state))
        except ValueError:
            pass

    def _finish_cancelled(self, steps: _Steps) -> None:
        cancelled, steps.cancelled = steps.cancelled, []
        for state in cancelled:
            self._finish(state)

    def _error(self) -> None:
        self.errors += 1
        if self.errors == 1:
            logger.exception("EnergyLedger call failed; generation goes on (logged once)")


def track_continuous_batching(
    target: Any, ledger: EnergyLedger, *, labels_of: LabelsOf | None = None
) -> ContinuousBatchingEnergy:
    """Report the engine steps of `target`'s continuous batching to `ledger`.

    Args:
        target: A transformers model (every `generate_batch`, `init_continuous_batching` and
            `continuous_batching_context_manager` from now on), a `ContinuousBatchingManager`
            or a `ContinuousBatchProcessor`.
        ledger: The ledger the steps go to. It is not closed by `detach`.
        labels_of: Labels of a request from its `RequestState` (see `ContinuousBatchingEnergy`).

    Returns:
        The attached hooks: a context manager that detaches on exit, or call `detach()`.

    Raises:
        ImportError: transformers (with continuous batching) is not installed.
        TypeError: `target` is not one of the above.

    """
    return ContinuousBatchingEnergy(ledger, labels_of=labels_of).attach(target)
