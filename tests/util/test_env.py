"""zeus.util.env.get_env (port of zeus 0.8's tests/util/test_env.py)."""

from __future__ import annotations

import pytest
from zeus.util.env import get_env


def test_int(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEUS_TEST_INT", "42")
    assert get_env("ZEUS_TEST_INT", int) == 42


def test_str(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEUS_TEST_STR", "hello")
    assert get_env("ZEUS_TEST_STR", str) == "hello"


@pytest.mark.parametrize(
    ("raw", "want"),
    [("true", True), ("True", True), ("TRUE", True), ("false", False), ("False", False)],
)
def test_bool(monkeypatch: pytest.MonkeyPatch, raw: str, want: bool) -> None:
    monkeypatch.setenv("ZEUS_TEST_BOOL", raw)
    assert get_env("ZEUS_TEST_BOOL", bool) is want


@pytest.mark.parametrize("raw", ["fault", "1", "0", "yes", ""])
def test_strange_bool(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("ZEUS_TEST_BOOL", raw)
    with pytest.raises(ValueError, match=f"Strange boolean environment variable value '{raw}'"):
        get_env("ZEUS_TEST_BOOL", bool)


def test_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZEUS_TEST_MISSING", raising=False)
    with pytest.raises(ValueError, match="Missing environment variable 'ZEUS_TEST_MISSING'"):
        get_env("ZEUS_TEST_MISSING", int)


def test_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZEUS_TEST_MISSING", raising=False)
    assert get_env("ZEUS_TEST_MISSING", int, default=7) == 7
    assert get_env("ZEUS_TEST_MISSING", bool, default=False) is False


def test_set_value_overrides_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEUS_TEST_INT", "3")
    assert get_env("ZEUS_TEST_INT", int, default=7) == 3


def test_bad_int_is_value_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEUS_TEST_INT", "four")
    with pytest.raises(ValueError, match="four"):
        get_env("ZEUS_TEST_INT", int)
