"""`ZeusDataLoader`: a PyTorch DataLoader that speaks `ZeusMaster`'s protocol.

Importing this module imports torch; `zeus.run` only imports it when `ZeusDataLoader` is
first accessed. The protocol logic itself lives in `zeus.run.session.JobSession`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, Literal

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from zeus.optimizer.recurring.run.session import JobSession

__all__ = ["ZeusDataLoader"]


def _cuda_sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _broadcast_decision(stop: bool) -> bool:
    """Rank 0's stop decision, on every rank."""
    flag = torch.tensor([1 if stop else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.broadcast(flag, src=0)
    return bool(flag.item())


class ZeusDataLoader(DataLoader):
    """A DataLoader that profiles power limits, measures epochs and stops early for Zeus.

    Make one train loader (with `max_epochs`) and optionally one eval loader::

        train_loader = ZeusDataLoader(train_set, batch_size=bs, max_epochs=100, shuffle=True)
        eval_loader = ZeusDataLoader(eval_set, batch_size=bs)
        for epoch in train_loader.epochs():
            for x, y in train_loader: ...
            for x, y in eval_loader: ...
            train_loader.report_metric(accuracy, higher_is_better=True)

    Args:
        dataset: Passed to `DataLoader`.
        batch_size: Per-process batch size, by keyword (as in the reference: `DataLoader`'s
            second positional parameter is `batch_size`, so no other argument can be
            positional).
        max_epochs: Set on the train loader only.
        distributed: `"dp"` for data parallel with `torch.distributed` (one process per GPU,
            a `DistributedSampler` matching the process group).
        **kwargs: Passed to `DataLoader`.

    Raises:
        ValueError: a second train loader, or a `"dp"` setup that does not match the group.

    """

    train_batch_size: ClassVar[int] = 0
    train_loader: ClassVar[ZeusDataLoader | None] = None
    eval_loader: ClassVar[ZeusDataLoader | None] = None
    session: ClassVar[JobSession | None] = None

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        batch_size: int,
        max_epochs: int = -1,
        distributed: Literal["dp"] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        self.split = "train" if max_epochs != -1 else "eval"
        self.world_size = 1
        self.rank = 0
        if distributed == "dp":
            if not dist.is_initialized():
                raise ValueError("distributed='dp' needs torch.distributed initialised")
            if not isinstance(self.sampler, DistributedSampler):
                raise ValueError("distributed='dp' needs a DistributedSampler")
            self.world_size = dist.get_world_size()
            self.rank = dist.get_rank()
            if (self.sampler.num_replicas, self.sampler.rank) != (self.world_size, self.rank):
                raise ValueError(
                    "the DistributedSampler's num_replicas/rank "
                    f"({self.sampler.num_replicas}, {self.sampler.rank}) do not match the "
                    f"process group ({self.world_size}, {self.rank})"
                )
        elif distributed is not None:
            raise ValueError(f"distributed must be 'dp' or None, got '{distributed}'")
        if self.split == "train":
            if ZeusDataLoader.train_batch_size != 0:
                raise ValueError("Specify max_epochs only to the train ZeusDataLoader.")
            ZeusDataLoader.train_batch_size = batch_size * self.world_size
            ZeusDataLoader.train_loader = self
            self.max_epochs = max_epochs
        else:
            ZeusDataLoader.eval_loader = self
        self._inner: Iterator[Any] | None = None

    def _session(self) -> JobSession:
        if ZeusDataLoader.session is None:
            train = ZeusDataLoader.train_loader
            if train is None:
                raise RuntimeError("create the train ZeusDataLoader (with max_epochs) first")
            evl = ZeusDataLoader.eval_loader
            ZeusDataLoader.session = JobSession(
                batch_size=ZeusDataLoader.train_batch_size,
                max_epochs=train.max_epochs,
                train_iters=len(train),
                eval_iters=0 if evl is None else len(evl),
                world_size=self.world_size,
                rank=self.rank,
                sync=_cuda_sync,
                decide=_broadcast_decision if self.world_size > 1 else None,
            )
        return ZeusDataLoader.session

    def epochs(self) -> Iterator[int]:
        """Epoch numbers until the target is reached, epochs run out or the cost cap hits.

        Raises:
            ZeusCostThresholdExceededError: on every rank, when the next epoch would cross the
                cost threshold.

        """
        if self.split != "train":
            raise RuntimeError("epochs() is only for the train loader")
        return self._session().epochs()

    def report_metric(self, metric: float, higher_is_better: bool) -> None:
        """Report the validation metric of this epoch."""
        self._session().report_metric(metric, higher_is_better)

    def __iter__(self) -> ZeusDataLoader:  # type: ignore[override]
        """Start an epoch."""
        self._session().begin_epoch(self.split)
        self._inner = super().__iter__()
        return self

    def __next__(self) -> Any:
        """The next batch; drives profiling on the train loader."""
        assert self._inner is not None
        session = self._session()
        if self.split == "train":
            session.before_train_iteration()
        try:
            return next(self._inner)
        except StopIteration:
            session.end_epoch(self.split)
            self._inner = None
            raise

    @classmethod
    def reset(cls) -> None:
        """Forget the train/eval loaders (for running several jobs in one process)."""
        cls.train_batch_size = 0
        cls.train_loader = None
        cls.eval_loader = None
        cls.session = None
