"""scripts/check-rust-module-cycles: sibling modules of a crate that depend on each other
are found (through `use crate::`, grouped uses, `super::` and inline paths), a child using its
parent is not a cycle, and the workspace has none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "check-rust-module-cycles"


def _check(crates: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(crates)], capture_output=True, text=True, check=False
    )


def _crate(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "demo" / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_cycle_through_grouped_uses_and_super_paths_is_found(tmp_path: Path) -> None:
    crates = _crate(
        tmp_path,
        {
            "lib.rs": "mod net;\nmod store;\n",
            "net/mod.rs": "mod wire;\n",
            # net -> store through a grouped use in a child module of net.
            "net/wire.rs": "use crate::{store::{Db, Row}, net};\n",
            # store -> net through an inline path after `super::`.
            "store.rs": "pub struct Db;\npub struct Row;\nfn f() { super::net::wire::g(); }\n",
        },
    )
    out = _check(crates)
    assert out.returncode == 1, out.stdout
    assert "demo: modules of crate depend on each other in a cycle: net, store" in out.stdout


def test_children_using_their_parent_and_one_way_siblings_pass(tmp_path: Path) -> None:
    crates = _crate(
        tmp_path,
        {
            "lib.rs": "pub struct Shared;\nmod a;\nmod b;\n",
            "a.rs": "use crate::Shared;\nuse crate::b::Thing;\n// crate::a is not a use\n",
            "b.rs": 'pub struct Thing;\nconst S: &str = "crate::a::x";\n',
        },
    )
    out = _check(crates)
    assert out.returncode == 0, out.stdout


def test_the_workspace_has_no_cycle() -> None:
    out = _check(REPO / "crates")
    assert out.returncode == 0, out.stdout
