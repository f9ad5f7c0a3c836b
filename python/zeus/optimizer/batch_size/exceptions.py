"""Errors the batch size optimizer client raises (names kept from the reference, typo included)."""

from __future__ import annotations

from zeus.exception import ZeusBaseError


class ZeusBSORuntimError(ZeusBaseError):
    """The server failed or answered something the client cannot use."""


class ZeusBSOTrainFailError(ZeusBaseError):
    """The trial stopped without converging; relaunch training to try another batch size."""


class ZeusBSOConfigError(ZeusBaseError):
    """The job or the machine is configured in a way the optimizer cannot work with."""


class ZeusBSOOperationOrderError(ZeusBaseError):
    """Methods were called out of order (e.g. `on_evaluate` before `get_batch_size`)."""


class ZeusBSOBadOperationError(ZeusBaseError):
    """The operation is not allowed here (e.g. asking the server from a rank other than 0)."""


__all__ = [
    "ZeusBSORuntimError",
    "ZeusBSOTrainFailError",
    "ZeusBSOConfigError",
    "ZeusBSOOperationOrderError",
    "ZeusBSOBadOperationError",
]
