"""Schemathesis against the Perseus server (a real `zeus-perseus-server` process); see
`tests/openapi_fuzz.py`.

One rule of the API is beyond JSON Schema: a job's `world_size` is the product of its three
parallelism degrees. Schema-valid registrations are made to follow it before they are sent
(schema-invalid ones are sent as generated).
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
from typing import Any, Iterator

import httpx
import pytest
from openapi_fuzz import FUZZ_TIMEOUT_S, is_positive, load
from zeus.optimizer.perseus.server.router import create_app

schema = load(create_app().openapi())


@pytest.fixture(scope="module")
def perseus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PERSEUS_LOG_LEVEL": "WARNING",
        "PERSEUS_DUMP_DIR": str(tmp_path_factory.mktemp("perseus-fuzz")),
    }
    cmd = [sys.executable, "-m", "zeus.optimizer.perseus.server.cli", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{base}/openapi.json")
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.timeout(FUZZ_TIMEOUT_S)
@schema.parametrize()
def test_fuzz_perseus_server(case: Any, perseus_url: str) -> None:
    if is_positive(case) and case.method == "POST" and case.operation.path == "/register_job":
        body = case.body
        # int(): a schema-valid integer may come as 3.0, and a float product can be inexact.
        degrees = (int(body[k]) for k in ("pp_degree", "dp_degree", "tp_degree"))
        body["world_size"] = math.prod(degrees)
    case.call_and_validate(base_url=perseus_url)
