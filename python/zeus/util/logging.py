"""Loggers with zeus's format, level from `ZEUS_LOG_LEVEL`."""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

_FORMAT = "[%(asctime)s] [%(name)s](%(filename)s:%(lineno)d) %(message)s"


def get_logger(name: str, level: int = logging.INFO, propagate: bool = False) -> logging.Logger:
    """Return the logger `name`, configured once with a stdout handler.

    `ZEUS_LOG_LEVEL` (a level name such as `DEBUG`) overrides `level`.
    """
    logger = logging.getLogger(name)
    if getattr(logger, "_zeus_configured", False):
        return logger
    env_level = os.environ.get("ZEUS_LOG_LEVEL")
    if env_level:
        resolved = logging.getLevelName(env_level.upper())
        if isinstance(resolved, int):
            level = resolved
    logger.setLevel(level)
    logger.propagate = propagate
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(_FORMAT))
    logger.addHandler(handler)
    logger._zeus_configured = True  # type: ignore[attr-defined]
    return logger


class FileAndConsole:
    """A stream that writes to both a file and the console (a tee for `sys.stdout`)."""

    def __init__(self, filepath: str) -> None:
        """Open `filepath` for writing and remember the current stdout."""
        self.file: TextIO = open(filepath, "w")
        self.stdout: TextIO = sys.stdout

    def write(self, message: str) -> None:
        """Write to both."""
        self.file.write(message)
        self.stdout.write(message)

    def flush(self) -> None:
        """Flush both."""
        self.file.flush()
        self.stdout.flush()
