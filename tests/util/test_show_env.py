"""`python -m zeus.show_env` is pasted into bug reports: it must not print credentials."""

from __future__ import annotations

import subprocess
import sys

from zeus.show_env import redact


def test_tokens_keys_and_url_passwords_are_not_printed() -> None:
    env = {
        "ZEUS_SIM_GPUS": "H100",
        "ZEUS_SIM_FIDELITY": "ideal",
        "ZEUS_BSO_TOKEN": "tok-123456",
        "ZEUS_BSO_DATABASE_URL": "postgresql+asyncpg://zeus:hunter2@db.example:5432/zeus",
        "ZEUSD_SIGNING_KEY": "c2VjcmV0",
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [sys.executable, "-m", "zeus.show_env"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "tok-123456" not in out and "hunter2" not in out, out
    assert "ZEUS_BSO_TOKEN=<redacted>" in out, out
    assert "ZEUS_BSO_DATABASE_URL=postgresql+asyncpg://zeus:***@db.example:5432/zeus" in out, out
    assert "ZEUS_SIM_GPUS=H100" in out, out


def test_what_is_not_a_credential_stays() -> None:
    assert redact("ZEUS_SIM_GPUS", "H100,A40") == "H100,A40"
    assert redact("ZEUS_URL", "http://host:8000/x") == "http://host:8000/x"
    assert redact("ZEUS_URL", "http://user:pw@host/x") == "http://user:***@host/x"
    assert redact("ZEUS_API_KEY", "") == ""
    assert redact("ZEUS_ANY_SECRET", "s") == "<redacted>"
