# Hand-kept stubs of the Rust extension `zeus._core` (see crates/zeus-core/src/python/): one
# submodule per concern, as the binding registers them. Keep in sync with the #[pymethods] /
# #[pyfunction] signatures.

from . import device as device
from . import monitor as monitor
from . import perseus as perseus
from . import power_limit as power_limit
from . import recurring as recurring
from . import settings as settings
from . import sim as sim
from . import util as util

__all__ = [
    "__version__",
    "device",
    "settings",
    "sim",
    "util",
    "monitor",
    "power_limit",
    "recurring",
    "perseus",
]

__version__: str
