"""Module names that alias ours: the reference's and Zeus 0.16's, and our own earlier ones.

The recurring-job concern lives in one folder, `zeus.optimizer.recurring`; its modules keep
the import paths of zeus 0.8.2 (`zeus.job`, `zeus.policy`, `zeus.run`, `zeus.simulate`,
`zeus.controller`) and of Zeus 0.16 (`zeus._legacy.*`). Zeus 0.16 renamed `zeus.util` to
`zeus.utils` and Perseus' package to `pipeline_frequency`; the simulated GPU was `zeus.sim`;
Zeus 0.16's `zeus.metric` (Pushgateway metrics) lives with the monitors, in `zeus.monitor.metric`;
its `zeus.utils.zeusd` (the daemon's client) with the devices, in `zeus.device.zeusd`.

An alias imports as the very module it names, not a copy: `zeus.utils.metric is
zeus.util.metric`, so classes and module state are shared. A meta-path finder maps every
`ALIAS.rest` to `TARGET.rest` on import. `ALIAS.__main__` is left to the normal finders, which
look in the target package's directory: so `python -m ALIAS` runs the target's `__main__`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Sequence

# Matched in order: an alias inside another alias's package comes before that package's.
ALIASES = {
    "zeus.utils.zeusd": "zeus.device.zeusd",
    "zeus.utils": "zeus.util",
    "zeus.optimizer.pipeline_frequency": "zeus.optimizer.perseus",
    "zeus.job": "zeus.optimizer.recurring.job",
    "zeus.policy": "zeus.optimizer.recurring.policy",
    "zeus.run": "zeus.optimizer.recurring.run",
    "zeus.simulate": "zeus.optimizer.recurring.simulate",
    "zeus.controller": "zeus.optimizer.recurring.controller",
    "zeus._legacy": "zeus.optimizer.recurring",
    "zeus.sim": "zeus.device.sim",
    "zeus.metric": "zeus.monitor.metric",
}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.endswith(".__main__"):
            return None
        for alias, real in ALIASES.items():
            if fullname == alias or fullname.startswith(alias + "."):
                real_spec = importlib.util.find_spec(real + fullname[len(alias) :])
                if real_spec is None:
                    return None
                # Say whether it is a package: `python -m` looks for `__main__` only in those.
                is_package = real_spec.submodule_search_locations is not None
                return importlib.util.spec_from_loader(fullname, self, is_package=is_package)
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
