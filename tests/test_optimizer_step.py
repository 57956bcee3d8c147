"""A per-parameter-loop optimizer pays a launch per op per tensor (``estimate/optimizer_step.py``).

The kernel counts come from the optimizers themselves, counted under a TorchDispatchMode; the
step's time is, tensor by tensor, the larger of its streamed bytes and its launches.
"""

from __future__ import annotations

import collections
import importlib.util
from collections.abc import Callable
from typing import Any

import pytest

from gpuplan.estimate.fit import model_shape
from gpuplan.estimate.optimizer_step import FORLOOP_KERNELS, forloop_step_s

BW = 800e9
LAUNCH = 5e-6


def _step(model: str, optimizer: str = "adamw", **kw: Any) -> float | None:
    shape = model_shape(model)
    args: dict[str, Any] = dict(
        full=True,
        lora_roles=frozenset(),
        lora_rank=0,
        layers=shape.layers,
        tp=1,
        bytes_per_param=40.0,
        bw=BW,
        launch=LAUNCH,
    )
    args.update(kw)
    return forloop_step_s(shape, optimizer, **args)


def test_small_tensors_are_launch_bound_and_large_ones_byte_bound() -> None:
    shape = model_shape("bert-large")
    loop = _step("bert-large")
    assert loop is not None
    streamed = shape.params_total * 40.0 / BW
    # BERT-large's 24 layers hold 16 tensors each, ten of them vectors (biases, norms)
    assert loop > streamed + 24 * 10 * 8 * LAUNCH * 0.9
    # at a far lower bandwidth every tensor is byte-bound: the loop is the bytes alone
    slow = _step("bert-large", bw=1e9)
    assert slow == pytest.approx(shape.params_total * 40.0 / 1e9, rel=0.01)


def test_lora_adapters_count_two_tensors_per_adapted_linear() -> None:
    shape = model_shape("llama-3.1-8b")
    loop = _step("llama-3.1-8b", full=False, lora_roles=frozenset({"q", "v"}), lora_rank=8)
    assert loop is not None
    # small adapters: launch-bound, 2 adapters x 2 matrices x 8 kernels a layer
    assert loop == pytest.approx(shape.layers * 2 * 2 * 8 * LAUNCH, rel=0.05)


def test_uncounted_optimizers_are_left_to_their_bytes() -> None:
    assert _step("gpt2", "adamw-8bit") is None
    assert FORLOOP_KERNELS["adamw"] == (8, 8)


VIEWS = frozenset({"unsqueeze", "view", "t", "expand", "alias", "detach", "_local_scalar_dense"})


def _cuda_kernels(make: Callable[[list[Any]], Any], shape: tuple[int, ...]) -> int:
    """Ops one tensor adds to a second optimizer step on tensors of ``shape``: views left out,
    and the ops on torch's step counters, 0-dim CPU tensors that launch no CUDA kernel."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    totals = []
    for n in (1, 2):
        params = [torch.nn.Parameter(torch.randn(*shape)) for _ in range(n)]
        opt = make(params)
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
        for p in params:
            p.grad = torch.randn_like(p)
        steps = {
            id(st["step"]) for st in opt.state.values() if isinstance(st.get("step"), torch.Tensor)
        }

        class Count(TorchDispatchMode):
            def __init__(self, skip: set[int]) -> None:
                super().__init__()
                self.skip = skip
                self.ops: collections.Counter[str] = collections.Counter()

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                name = func.overloadpacket.__name__
                if name not in VIEWS and not any(id(a) in self.skip for a in args):
                    self.ops[name] += 1
                return func(*args, **(kwargs or {}))

        with Count(steps) as c:
            opt.step()
        totals.append(sum(c.ops.values()))
    return totals[1] - totals[0]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_the_counts_match_torch_optimizers() -> None:
    import torch

    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, foreach=False)  # noqa: E731
    sgd_m = lambda ps: torch.optim.SGD(  # noqa: E731
        ps, lr=1e-3, momentum=0.9, weight_decay=1e-4, foreach=False
    )
    for shape in ((64,), (64, 32)):
        assert _cuda_kernels(adamw, shape) == FORLOOP_KERNELS["adamw"][len(shape) - 1]
        assert _cuda_kernels(sgd_m, shape) == FORLOOP_KERNELS["sgd-momentum"][len(shape) - 1]


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs the trace extra"
)
def test_the_adafactor_counts_match_transformers() -> None:
    import transformers

    def adafactor(ps: list[Any]) -> Any:
        return transformers.optimization.Adafactor(
            ps, lr=1e-3, relative_step=False, scale_parameter=False
        )

    assert _cuda_kernels(adafactor, (64,)) == FORLOOP_KERNELS["adafactor"][0]
    assert _cuda_kernels(adafactor, (64, 32)) == FORLOOP_KERNELS["adafactor"][1]
