"""Traced memory estimator: run the real PyTorch model on the meta device.

Needs the ``trace`` extra (torch and transformers). Nothing is downloaded and
no GPU is used: the model is built from its config on ``meta``, two training
iterations run under ``MemTracker``, and the steady-state peak is read.
"""

from gpuplan.trace.run import TraceResult, require_torch, trace_fit, trace_memory

__all__ = ["TraceResult", "require_torch", "trace_fit", "trace_memory"]
