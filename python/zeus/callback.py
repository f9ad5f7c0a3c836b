"""Training-loop callbacks: the hooks every optimizer implements."""

from __future__ import annotations

from typing import Iterable


class Callback:
    """Base class of training-loop callbacks; every hook is a no-op."""

    def on_train_begin(self) -> None:
        """Called at the start of training."""

    def on_train_end(self) -> None:
        """Called at the end of training."""

    def on_epoch_begin(self) -> None:
        """Called at the start of each epoch."""

    def on_epoch_end(self) -> None:
        """Called at the end of each epoch."""

    def on_step_begin(self) -> None:
        """Called at the start of each training step."""

    def on_step_end(self) -> None:
        """Called at the end of each training step."""

    def on_evaluate(self, metric: float) -> None:
        """Called after evaluation with the validation metric."""

    def on_instruction_begin(self, name: str) -> None:
        """Called before a pipeline instruction (e.g. `forward`) runs."""

    def on_instruction_end(self, name: str) -> None:
        """Called after a pipeline instruction ran."""


class CallbackSet(Callback):
    """Fans every hook out to a list of callbacks, in list order."""

    def __init__(self, callbacks: Iterable[Callback]) -> None:
        """Keep the callbacks, in order."""
        self.callbacks = list(callbacks)

    def on_train_begin(self) -> None:  # noqa: D102
        for c in self.callbacks:
            c.on_train_begin()

    def on_train_end(self) -> None:  # noqa: D102
        for c in self.callbacks:
            c.on_train_end()

    def on_epoch_begin(self) -> None:  # noqa: D102
        for c in self.callbacks:
            c.on_epoch_begin()

    def on_epoch_end(self) -> None:  # noqa: D102
        for c in self.callbacks:
            c.on_epoch_end()

    def on_step_begin(self) -> None:  # noqa: D102
        for c in self.callbacks:
            c.on_step_begin()

    def on_step_end(self) -> None:  # noqa: D102
        for c in self.callbacks:
            c.on_step_end()

    def on_evaluate(self, metric: float) -> None:  # noqa: D102
        for c in self.callbacks:
            c.on_evaluate(metric)

    def on_instruction_begin(self, name: str) -> None:  # noqa: D102
        for c in self.callbacks:
            c.on_instruction_begin(name)

    def on_instruction_end(self, name: str) -> None:  # noqa: D102
        for c in self.callbacks:
            c.on_instruction_end(name)
