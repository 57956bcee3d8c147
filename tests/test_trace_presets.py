"""Analytic and traced estimators on every preset they share (issue 11, item 8).

Every preset that ships a Hugging Face config is traced on the meta device and
its peak allocated memory compared with the analytic model's, within 10% or
with the difference explained in ``EXPLAINED``. Two jobs (the LoRA one on every
preset, the full one on one preset per family):

- ``full``: full fine-tune, ``bf16-mixed`` AdamW, micro-batch 1: the peak is the
  optimizer step (parameters, gradients, AdamW state and its foreach temporaries);
- ``lora``: LoRA (the default targets) on a ``bf16-true`` base, micro-batch 2 of
  1024 tokens (512 for encoders): the peak is activations and logits, in forward
  or backward.

To keep the suite fast, text models are traced with 1 and 2 layers and
extrapolated per phase (the path ``--trace`` takes above 9B parameters), and
vision models at 64 x 64 pixels (the ``image_size`` scaling is the analytic
model's own; the traced architecture is the full one).
"""

from __future__ import annotations

from importlib import resources

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import gpuplan.trace.run as trace_run  # noqa: E402
from gpuplan.catalog.loader import load_catalog  # noqa: E402
from gpuplan.estimate.fit import fit, model_shape  # noqa: E402
from gpuplan.spec import parse_spec  # noqa: E402

PRESETS = sorted(
    node.name.removesuffix(".json")
    for node in resources.files("gpuplan.models").joinpath("data").iterdir()
    if node.name.endswith(".json")
)

EAGER = frozenset(
    {"bloom-560m", "bloom-1b7", "bloom-3b", "bloom-7b1", "bloom-176b", "mpt-7b", "mpt-30b"}
)
"""ALiBi models: transformers runs their own eager attention (no fused path to trace), so
the analytic side is asked for ``attention: eager`` too, like for like."""

_GPT2_LORA = (
    "traced above the analytic estimate: the default q_proj/v_proj targets adapt GPT-2's fused "
    "c_attn whole (as PEFT does), so the adapter's fp32 B output and its 16-bit cast are 3h wide, "
    "and transformers splits that fused QKV output into q, k, v copies; the analytic items list "
    "narrower adapter outputs"
)
_ALIBI = (
    "traced above the analytic estimate: transformers' own eager ALiBi attention (bias added "
    "by baddbmm/add, a masked_fill copy of the scores, fp32 softmax) keeps more s^2-sized "
    "tensors per layer than the eager attention items of the analytic model"
)
_FUSED_EXPERTS = (
    "analytic above traced: transformers 5 holds a mixture of experts' experts as fused 3D "
    "parameters (Qwen3MoeExperts), not nn.Linear modules, so the traced LoRA on every linear "
    "adapts attention and the router only, while the analytic job puts an adapter on each "
    "expert's projections (transformers 4's per-expert nn.Linear, or PEFT target_parameters): "
    "their fp32 weights, gradients, Adam state and saved activations"
)
EXPLAINED: dict[tuple[str, str], tuple[float, str]] = {
    ("gpt2", "lora"): (0.17, _GPT2_LORA + " (measured -14%)"),
    ("gpt2-medium", "lora"): (0.22, _GPT2_LORA + " (measured -19%)"),
    ("gpt2-large", "lora"): (0.24, _GPT2_LORA + " (measured -21%)"),
    ("gpt2-xl", "lora"): (0.24, _GPT2_LORA + " (measured -21%)"),
    ("gpt3-175b", "lora"): (0.15, _GPT2_LORA + " (GPT-2 architecture; measured -11%)"),
    (
        "gpt-neox-20b",
        "lora",
    ): (
        0.18,
        "traced above the analytic estimate (measured -15%): transformers' GPT-NeoX applies "
        "partial rotary embeddings by slicing q and k and concatenating them back (two more "
        "copies of q and k per layer) after splitting a fused QKV output",
    ),
    ("bloom-560m", "lora"): (0.27, _ALIBI + " (measured -24%)"),
    ("bloom-1b7", "lora"): (0.22, _ALIBI + " (measured -19%)"),
    ("bloom-3b", "lora"): (0.31, _ALIBI + " (measured -28%)"),
    ("bloom-7b1", "lora"): (0.24, _ALIBI + " (measured -20%)"),
    ("bloom-176b", "lora"): (0.16, _ALIBI + " (measured -13%)"),
    ("mpt-7b", "lora"): (0.28, _ALIBI + " (measured -25%)"),
    ("mpt-30b", "lora"): (0.30, _ALIBI + " (MPT 7B measured -25%)"),
    ("qwen3-30b-a3b", "lora"): (0.19, _FUSED_EXPERTS + " (measured +16.7%)"),
    ("qwen3-235b-a22b", "lora"): (0.13, _FUSED_EXPERTS + " (measured +10.0%)"),
}
"""(preset, job) -> (tolerance, why analytic and traced differ by more than 10%)."""

FULL_JOB_PRESETS = ("bert-base", "gpt2", "llama-3.2-1b", "resnet-50", "vit-b-16")
"""The full fine-tune job peaks at the optimizer step (16 bytes per parameter on both sides,
checked on every preset when this test was written); kept to one preset per family for time."""


def _job(model: str, job: str) -> dict[str, object]:
    family = model_shape(model).family
    if job == "full":
        data: dict[str, object] = {"precision": "bf16-mixed", "micro_batch_size": 1}
    else:
        data = {"precision": "bf16-true", "method": "lora", "micro_batch_size": 2}
    if family in ("cnn", "vit"):
        data.update(image_size=64, micro_batch_size=4)
    else:
        data["seq_len"] = 512 if job == "full" or family == "encoder" else 1024
    if model in EAGER:
        data["attention"] = "eager"
    return {"model": model, **data}


CASES = [(model, "lora") for model in PRESETS] + [(model, "full") for model in FULL_JOB_PRESETS]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "job"), CASES)
def test_analytic_matches_traced_on_every_preset(
    model: str, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    family = model_shape(model).family
    if job == "lora" and family == "cnn":
        pytest.skip("LoRA targets attention/MLP linears; a CNN has none")
    monkeypatch.setattr(trace_run, "MAX_TRACED_PARAMS", 0)  # always the 1-and-2-layer path
    spec = parse_spec(_job(model, job))
    analytic = fit(spec, load_catalog(use_user=False).gpu("H100-SXM"), 1)
    traced = trace_run.trace_fit(spec, analytic)
    tolerance, _why = EXPLAINED.get((model, job), (0.10, ""))
    a, t = analytic.memory.peak_allocated_bytes, traced.memory.peak_allocated_bytes
    assert abs(a - t) / t <= tolerance, f"analytic {a / 2**30:.2f} GiB, traced {t / 2**30:.2f} GiB"


def test_every_explained_difference_names_a_preset() -> None:
    for (model, job), (tolerance, why) in EXPLAINED.items():
        assert model in PRESETS and job in ("full", "lora")
        assert tolerance > 0.10 and why
