"""CUDA autocast semantics on meta tensors.

``torch.autocast`` does nothing for meta tensors, and CPU autocast keeps
LayerNorm and softmax in 16 bits where CUDA runs them in fp32. This
``TorchFunctionMode`` applies the CUDA rules (PyTorch "Automatic Mixed
Precision" op reference): matmul-like ops run in the low-precision dtype,
norms, softmax and losses in fp32, and casts of leaf weights are cached for the
iteration as autocast's weight cache does.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

F = torch.nn.functional

_LOW = {
    F.linear,
    torch.matmul,
    torch.mm,
    torch.bmm,
    torch.addmm,
    torch.baddbmm,
    torch.addbmm,
    F.conv1d,
    F.conv2d,
    F.conv3d,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.Tensor.mm,
    torch.Tensor.bmm,
    torch.Tensor.addmm,
    torch.Tensor.baddbmm,
}
if hasattr(torch, "_grouped_mm"):  # MoE experts in transformers 5 (on the lower-precision list)
    _LOW.add(torch._grouped_mm)
_FP32 = {
    F.layer_norm,
    F.group_norm,
    F.softmax,
    F.log_softmax,
    F.cross_entropy,
    F.nll_loss,
    F.mse_loss,
    torch.softmax,
    torch.log_softmax,
    torch.Tensor.softmax,
    torch.Tensor.log_softmax,
    torch.logsumexp,
    torch.exp,
    torch.log,
    torch.rsqrt,
    torch.pow,
    torch.Tensor.pow,
    F.softplus,
    F.binary_cross_entropy_with_logits,
    torch.cumsum,
}


class CudaAutocast(TorchFunctionMode):
    """Emulate ``torch.autocast("cuda", dtype)`` for any device, meta included."""

    active: torch.dtype | None = None
    """The low-precision dtype while a CudaAutocast is entered (read by the fused-attention shim,
    which calls aten kernels directly: SDPA is on autocast's lower-precision list)."""

    def __enter__(self) -> CudaAutocast:
        self._outer.append(CudaAutocast.active)
        CudaAutocast.active = self.dtype
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: object) -> None:
        CudaAutocast.active = self._outer.pop()
        if not self._outer:
            # autocast empties its weight-cast cache on leaving the outermost context: the
            # 16-bit copies then live only as long as the autograd graph that saved them
            self.clear_cache()
        super().__exit__(*exc)  # type: ignore[no-untyped-call]

    def recompute_context(self) -> tuple[contextlib.AbstractContextManager[Any], CudaAutocast]:
        """``context_fn`` for non-reentrant ``torch.utils.checkpoint``.

        Checkpointed layers recompute their forward inside backward, where this
        mode is not on the stack; re-entering it there keeps the recomputed
        dtypes equal to the saved ones (else torch raises ``CheckpointError``).
        """
        return contextlib.nullcontext(), self

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self._cache: dict[int, torch.Tensor] = {}
        self._outer: list[torch.dtype | None] = []
        self.weight_cast_bytes = 0
        """The most bytes the weight-cast cache held in one iteration: the 16-bit copies of
        the trainable weights that a forward keeps (saved for backward)."""

    def clear_cache(self) -> None:
        """Drop cached weight casts (autocast does this on leaving the context)."""
        held = sum(t.numel() * t.element_size() for t in self._cache.values())
        self.weight_cast_bytes = max(self.weight_cast_bytes, held)
        self._cache.clear()

    def _cast(self, value: Any, dtype: torch.dtype) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
            if value.is_leaf and value.requires_grad and dtype == self.dtype:
                key = id(value)
                if key not in self._cache:
                    self._cache[key] = value.to(dtype)
                return self._cache[key]
            return value.to(dtype)
        if isinstance(value, (list, tuple)):
            return type(value)(self._cast(v, dtype) for v in value)
        return value

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _LOW:
            args = self._cast(args, self.dtype)
            kwargs = {k: self._cast(v, self.dtype) for k, v in kwargs.items()}
        elif func in _FP32:
            args = self._cast(args, torch.float32)
            kwargs = {
                k: self._cast(v, torch.float32) if k != "dtype" else v for k, v in kwargs.items()
            }
        return func(*args, **kwargs)
