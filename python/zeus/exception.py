"""Base exception of every error zeus raises on purpose."""

from __future__ import annotations

from typing import Optional


class ZeusBaseError(Exception):
    """Base class of zeus's exceptions.

    Attributes:
        message: Human-readable description of the error.
        cli_hint: What a command-line user should do about it (`zeus.util.cli` prints it
            under the message), or None where the message says all.
        cli_summary: The one line a command line shows instead of the message, or None.

    """

    cli_hint: Optional[str] = None
    cli_summary: Optional[str] = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
