"""Gradient passes outside the optimizer's update: what the training loop does to every
gradient a rank holds each step besides reducing it and applying it.

Each is a streaming pass over gradient bytes, read from the engines' source:

- **DDP's bucket copies.** PyTorch's ``DistributedDataParallel`` (``gradient_as_bucket_view``
  off, its default) copies each gradient into its bucket as the gradient is ready, dividing by
  the world size in the same pass (``Reducer::mark_variable_ready_dense``,
  ``torch/csrc/distributed/c10d/reducer.cpp``), and copies the reduced bucket back into
  ``.grad`` when backward ends (``Reducer::finalize_bucket_dense``): a read and a write each
  way, once a step (accumulating micro-batches run under ``no_sync``).
- **The loss scaler's unscale.** fp16 under torch autocast runs ``GradScaler.unscale_``
  (``torch/amp/grad_scaler.py``: ``_amp_foreach_non_finite_check_and_unscale_``), which reads
  and writes every gradient; Megatron's fp16 optimizer does the same to its main gradients
  (``MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan``,
  ``megatron/core/optimizer/optimizer.py``).
- **Clipping by the global norm.** ``torch.nn.utils.clip_grad_norm_`` reads every gradient for
  the norm and scales each in place (a read and a write); Megatron's ``clip_grad_norm_fp32``
  (``megatron/core/optimizer/clip_grads.py``) runs the same two kernels (``multi_tensor_l2norm``,
  ``multi_tensor_scale``) over its main gradients.
- **zero_grad in place.** ``zero_grad(set_to_none=False)``, PyTorch's default before 2.0,
  writes zeros over every gradient.
"""

from __future__ import annotations

import dataclasses

DDP_COPY_PASSES = 4
"""Bytes moved per gradient byte by DDP's two bucket copies: read and write each way."""
UNSCALE_PASSES = 2
"""The unscale reads and writes each gradient."""
CLIP_PASSES = 3
"""Clipping reads each gradient for the norm, then reads and writes it to scale it."""
ZERO_FILL_PASSES = 1
"""Zeroing in place writes each gradient."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GradPasses:
    """Which gradient passes a step runs (each ``True`` is priced)."""

    ddp_bucket_copies: bool = False
    unscale: bool = False
    clip: bool = False
    zero_fill: bool = False

    @property
    def passes(self) -> int:
        """Gradient bytes moved per gradient byte held, all passes together."""
        return (
            DDP_COPY_PASSES * self.ddp_bucket_copies
            + UNSCALE_PASSES * self.unscale
            + CLIP_PASSES * self.clip
            + ZERO_FILL_PASSES * self.zero_fill
        )

    def names(self) -> tuple[str, ...]:
        """The passes run, in step order, as the assumptions name them."""
        named = (
            (self.ddp_bucket_copies, "DDP's bucket copies (in and back)"),
            (self.unscale, "the loss scaler's unscale"),
            (self.clip, "clipping by the global norm (norm, then scale)"),
            (self.zero_fill, "zero_grad in place"),
        )
        return tuple(name for on, name in named if on)


def default_clipping(framework: str, hf_trainer: bool) -> bool:
    """Whether a framework's training loop clips gradients when the spec does not say:
    Hugging Face's Trainer (``TrainingArguments.max_grad_norm`` defaults to 1.0), Megatron
    (``--clip-grad`` defaults to 1.0, ``megatron/training/arguments.py``) and torchtitan
    (``training.max_norm`` defaults to 1.0, ``torchtitan/config/job_config.py``). DeepSpeed's
    ``gradient_clipping`` defaults to 0 (off), also under the Trainer, which fills it only where
    the config says ``auto``; the other loops clip only where their configs say so."""
    if framework == "hf":
        return hf_trainer
    return framework in ("megatron", "torchtitan")


def grad_passes_s(passes: GradPasses, held_grad_bytes: float, bandwidth: float) -> float:
    """Seconds of ``passes`` over ``held_grad_bytes`` (the gradients a rank holds, in their
    dtype) at ``bandwidth`` bytes/s achieved."""
    return passes.passes * held_grad_bytes / bandwidth
