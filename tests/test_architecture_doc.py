"""docs/architecture.md and the package's module docstrings name only paths that exist: a file
or folder they point a reader to (in backquotes: `crates/zeus-core/src/device/`,
`util/cli.py`, `routes.py`) is in the tree, under the repository root or under any folder (the
document names paths relative to the concern's root, Rust or Python)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"

# What the build puts in place (`scripts/dev-build`, the wheel): not in the tree.
BUILT = ("zeus/_bin/",)

# A path-like token: letters, digits, `_.-` and slashes, with a slash or a source suffix.
_PATH = re.compile(r"^[\w.-]+(/[\w.-]+)*/?$")
_SOURCE = re.compile(r"\.(rs|py|pyi|toml|sh|md)$")


def _named_paths(text: str) -> set[str]:
    out = set()
    for token in re.findall(r"`([^`\s]+)`", text):
        path = token.split(":")[0]  # `file.rs:123` and the like
        if not _PATH.match(path) or path.startswith((".", "-")):
            continue
        if "/" in path or _SOURCE.search(path):
            out.add(path)
    return out


def _tree() -> tuple[set[str], set[str]]:
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    dirs = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    return set(files), dirs


def _missing(named: set[str]) -> list[str]:
    files, dirs = _tree()
    missing = []
    for path in sorted(named):
        bare = path.rstrip("/")
        if any(b.rstrip("/") in bare for b in BUILT):
            continue
        if bare in files or bare in dirs:
            continue
        suffix = "/" + bare
        if any(f.endswith(suffix) for f in files) or any(d.endswith(suffix) for d in dirs):
            continue
        missing.append(path)
    return missing


_GIT = pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs the git tree"
)


@_GIT
def test_every_path_the_architecture_names_exists() -> None:
    named = _named_paths(DOC.read_text())
    assert len(named) > 50, "the document names its paths in backquotes"
    missing = _missing(named)
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


@_GIT
def test_every_path_a_module_docstring_names_exists() -> None:
    missing = {}
    for module in sorted((REPO / "python" / "zeus").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(module.read_text())) or ""
        # Only paths with a folder in them: a bare `file.py` in a docstring is often upstream's.
        gone = _missing({p for p in _named_paths(doc) if "/" in p})
        if gone:
            missing[str(module.relative_to(REPO))] = gone
    assert not missing, f"module docstrings name paths that do not exist: {missing}"
