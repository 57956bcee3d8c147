"""The safety margin of the memory verdict: the one place it is set.

``fits`` means ``device_used_bytes <= capacity x (1 - margin)``, capacity being the
memory the device reports (nvidia-smi ``memory.total``). A leaf module, so the CLI can
show the default without importing the estimators.
"""

from __future__ import annotations

DEFAULT_SAFETY_MARGIN = 0.0
"""Share of the device's capacity kept free when deciding ``fits``. None by default: the point
estimate is compared with the capacity, and the calibrated bounds
(:mod:`gpuplan.estimate.bounds`) say how sure that is (the ``fits``/``tight``/``no``
verdict), instead of a fixed 5% for every job."""
