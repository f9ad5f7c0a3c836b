"""OpenAPI fuzzing of the servers with schemathesis, shared by their fuzz tests.

Each server's OpenAPI document is generated in-process (no server needed at collection), and
schemathesis sends every operation positive (schema-valid) and negative (schema-invalid)
requests to a real server process, with every check it has on: no 5xx, no status code or
header or content type the document does not declare, answers that match their schemas,
schema-valid requests accepted (2xx, or 404/409 for things that do not exist or conflict),
schema-invalid ones refused, 405 with `Allow` for other methods, 401 without the token.

Bounded: `FUZZ_EXAMPLES` random requests per operation and mode (`ZEUS_FUZZ_EXAMPLES`
overrides it for a longer local run), plus schemathesis's deterministic boundary cases; all
three servers take well under a minute on two cores.

Schemathesis comes with the `test` extra; without it these tests skip, saying so.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

schemathesis = pytest.importorskip(
    "schemathesis", reason="needs schemathesis, from the test extra: pip install -e '.[test]'"
)
from schemathesis.config import SchemathesisConfig  # noqa: E402

FUZZ_EXAMPLES = int(os.environ.get("ZEUS_FUZZ_EXAMPLES", "100"))
# A whole operation's fuzzing, on a slow machine, with room to spare.
FUZZ_TIMEOUT_S = 240

_CONFIG = SchemathesisConfig.from_dict(
    {
        "generation": {"mode": "all", "max-examples": FUZZ_EXAMPLES},
        # Stateful runs follow OpenAPI links, which these APIs do not declare.
        "phases": {"stateful": {"enabled": False}},
    }
)


def load(document: dict[str, Any]) -> Any:
    """The schemathesis schema of an OpenAPI document."""
    return schemathesis.openapi.from_dict(document, config=_CONFIG)


def is_positive(case: Any) -> bool:
    """Whether schemathesis generated `case` as schema-valid (it then expects acceptance)."""
    return case.meta is not None and case.meta.generation.mode.is_positive
