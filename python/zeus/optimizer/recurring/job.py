"""`Job`: the specification of a recurring training job."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Job", "HistoryEntry"]

# Whole command-line tokens that `gen_command` replaces, and which value each takes.
_BATCH_SIZE = ("{bs}", "{batch_size}")
_LEARNING_RATE = ("{lr}", "{learning_rate}")
_EPOCHS = ("{epoch}", "{epochs}")

# Optimizers whose learning rate scales with the square root of the batch size (adaptive ones)
# or linearly (SGD).
_SQRT_RULE = ("adam", "adadelta", "adamw")
_LINEAR_RULE = ("sgd",)


@dataclass(frozen=True, unsafe_hash=True)
class Job:
    """A recurring DNN training job.

    A job is identified by its dataset, network, optimizer, target metric and maximum number of
    epochs (plus the defaults). `command` is not part of the identity, so the same job launched
    by a different script hashes and compares equal.

    Attributes:
        dataset: Name of the dataset.
        network: Name of the DNN.
        optimizer: Name of the optimizer, e.g. `Adam`.
        target_metric: Validation metric that counts as "trained".
        max_epochs: Epochs after which a run that has not reached the target gives up.
        default_bs: The user's default batch size.
        default_lr: Learning rate at `default_bs`.
        workdir: Working directory in which `command` runs.
        command: Command line of one run. Whole tokens `{bs}`/`{batch_size}`,
            `{lr}`/`{learning_rate}`, `{seed}`, `{epoch}`/`{epochs}`, `{slice_number}` and
            `{target_metric}` are substituted by `gen_command`.

    """

    dataset: str
    network: str
    optimizer: str
    target_metric: float
    max_epochs: int
    default_bs: int | None = None
    default_lr: float | None = None
    workdir: str | None = None
    command: list[str] | None = field(default=None, hash=False, compare=False)

    def __str__(self) -> str:
        """`Job(dataset,network,optimizer,target[,bs{default_bs}]~{max_epochs})`."""
        bs = "" if self.default_bs is None else f",bs{self.default_bs}"
        return (
            f"Job({self.dataset},{self.network},{self.optimizer},{self.target_metric}"
            f"{bs}~{self.max_epochs})"
        )

    def to_logdir(self) -> str:
        """A string that identifies the job in a log directory name."""
        return (
            f"{self.dataset}+{self.network}+bs{self.default_bs}+{self.optimizer}"
            f"+lr{self.default_lr}+tm{self.target_metric}+me{self.max_epochs}"
        )

    def filter_df(self, df: Any) -> Any:
        """Keep the rows of a trace DataFrame that belong to this job.

        Rows match on `dataset`, `network`, `optimizer` and `target_metric`. Works with any
        pandas-like DataFrame; pandas itself is not needed to import this module.

        Args:
            df: A DataFrame with (at least) those four columns.

        """
        missing = [
            c for c in ("dataset", "network", "optimizer", "target_metric") if c not in df.columns
        ]
        if missing:
            raise ValueError(f"DataFrame has no column(s) {missing} to filter {self} on")
        mask = (
            (df.dataset == self.dataset)
            & (df.network == self.network)
            & (df.optimizer == self.optimizer)
            & (df.target_metric == self.target_metric)
        )
        return df.loc[mask]

    def gen_command(
        self, batch_size: int, learning_rate: float, seed: int, rec_i: int
    ) -> list[str]:
        """The command of one run, with placeholders substituted.

        Only whole tokens are replaced, so `--bs={bs}` is left alone; write `--bs {bs}`.

        Args:
            batch_size: Batch size of this run.
            learning_rate: Learning rate of this run.
            seed: Random seed of this run.
            rec_i: Recurrence number (`{slice_number}`, e.g. the data slice of a drifting
                dataset).

        Raises:
            ValueError: the job has no command.

        """
        if not self.command:
            raise ValueError(f"{self} has no command to generate")
        values = {
            "{seed}": str(seed),
            "{slice_number}": str(rec_i),
            "{target_metric}": str(self.target_metric),
        }
        for tok in _BATCH_SIZE:
            values[tok] = str(batch_size)
        for tok in _LEARNING_RATE:
            values[tok] = str(learning_rate)
        for tok in _EPOCHS:
            values[tok] = str(self.max_epochs)
        return [values.get(tok, tok) for tok in self.command]

    def scale_lr(self, batch_size: int) -> float:
        """The learning rate for `batch_size`, scaled from the defaults.

        Adam, AdamW and Adadelta use the square-root rule, SGD the linear rule (case
        insensitive).

        Raises:
            ValueError: `default_bs` or `default_lr` is unset, or `batch_size` is not positive.
            NotImplementedError: no rule is known for the optimizer.

        """
        if self.default_bs is None or self.default_lr is None:
            raise ValueError(f"{self} needs default_bs and default_lr to scale the learning rate")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        opt = self.optimizer.lower()
        ratio = batch_size / self.default_bs
        if opt in _SQRT_RULE:
            return self.default_lr * math.sqrt(ratio)
        if opt in _LINEAR_RULE:
            return self.default_lr * ratio
        raise NotImplementedError(f"No learning rate scaling rule for optimizer '{self.optimizer}'")


@dataclass
class HistoryEntry:
    """One run of a recurring job (the reference's `zeus.analyze.HistoryEntry`).

    Attributes:
        bs: Batch size.
        pl: Power limit in W (None when the run did not fix one, as in `ZeusMaster`).
        energy: Joules.
        reached: Whether the run reached the target metric.
        time: Seconds.

    """

    bs: int
    pl: int | None
    energy: float
    reached: bool
    time: float
