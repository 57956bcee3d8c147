"""gpuplan: will it fit, how long will it take, what will it cost, and is it idle.

The public API is re-exported here; everything else is internal and may change.
Importing this package does no I/O and imports nothing heavy (no torch).
"""

from gpuplan.errors import GpuPlanError

__version__ = "0.1.0"

__all__ = ["GpuPlanError", "__version__"]
