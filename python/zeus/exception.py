"""Base exception of every error zeus raises on purpose."""

from __future__ import annotations


class ZeusBaseError(Exception):
    """Base class of zeus's exceptions.

    Attributes:
        message: Human-readable description of the error.

    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
