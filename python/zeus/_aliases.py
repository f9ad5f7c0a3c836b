"""Zeus 0.16 module names that alias ours (`zeus.utils` is `zeus.util`, ...).

An alias imports as the very module it names, not a copy: `zeus.utils.metric is
zeus.util.metric`, so classes and module state are shared. A meta-path finder maps every
`ALIAS.rest` to `TARGET.rest` on import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Sequence

ALIASES = {
    "zeus.utils": "zeus.util",
    "zeus.optimizer.pipeline_frequency": "zeus.optimizer.perseus",
}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        for alias in ALIASES:
            if fullname == alias or fullname.startswith(alias + "."):
                return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        for alias, real in ALIASES.items():
            if spec.name == alias or spec.name.startswith(alias + "."):
                return importlib.import_module(real + spec.name[len(alias) :])
        raise ImportError(f"{spec.name} is not an alias")  # pragma: no cover

    def exec_module(self, module: ModuleType) -> None:
        # The target module ran when it was imported; nothing more to do.
        return None


def install() -> None:
    """Put the alias finder on `sys.meta_path` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        # First: the path finder would otherwise load `ALIAS.sub` again from the target's
        # directory, as a second module.
        sys.meta_path.insert(0, _AliasFinder())
