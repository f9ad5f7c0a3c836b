"""Zeus: measure and cut the energy that deep-learning jobs spend on GPUs.

The heavy lifting lives in the Rust extension `zeus._core`; the subpackages are thin, idiomatic
wrappers around it:

- `zeus.device`: the GPUs (NVML, or the simulated GPU with `ZEUS_GPU_BACKEND=sim`).
- `zeus.monitor`: time and energy of code windows, power over time.
- `zeus.optimizer`: power-limit, batch-size and pipeline-frequency optimizers.
- `zeus.util`: the cost metric and helpers.

Submodules are imported lazily, so `import zeus` stays cheap and optional dependencies are only
needed by the parts that use them. Zeus 0.16's module names `zeus.utils` and
`zeus.optimizer.pipeline_frequency` import as `zeus.util` and `zeus.optimizer.perseus`.
"""

from zeus import _aliases
from zeus._core import __version__

_aliases.install()

__all__ = ["__version__"]
