"""zeus.util.logging."""

from __future__ import annotations

import logging
import sys
import uuid
from pathlib import Path

import pytest
from zeus.util.logging import FileAndConsole, get_logger


def test_logger_is_configured_once_with_the_zeus_format(capsys: pytest.CaptureFixture[str]) -> None:
    name = f"zeus.test.{uuid.uuid4().hex}"
    a = get_logger(name)
    b = get_logger(name)
    assert a is b and len(a.handlers) == 1 and a.propagate is False
    assert a.level == logging.INFO
    a.info("hello %d", 7)
    out = capsys.readouterr().out
    assert f"[{name}](test_logging.py:" in out and out.rstrip().endswith("hello 7")


def test_level_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEUS_LOG_LEVEL", "debug")
    assert get_logger(f"zeus.test.{uuid.uuid4().hex}").level == logging.DEBUG


def test_file_and_console(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tee = FileAndConsole(str(tmp_path / "log.txt"))
    assert tee.stdout is sys.stdout
    tee.write("both\n")
    tee.flush()
    assert (tmp_path / "log.txt").read_text() == "both\n"
    assert capsys.readouterr().out == "both\n"
