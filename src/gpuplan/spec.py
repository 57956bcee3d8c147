"""The job spec: the one description of a workload that every command reads.

A job spec is YAML (or JSON), validated by :class:`JobSpec`. Field names are a
contract shared with tools outside this repo: extend, never rename.

Example::

    model: llama-3-8b
    method: lora
    lora: {rank: 16, alpha: 32, targets: [q_proj, v_proj]}
    precision: bf16-mixed
    optimizer: adamw
    micro_batch_size: 4
    global_batch_size: 64
    seq_len: 2048
    activation_checkpointing: full
    parallelism: auto
    work: {tokens: 200000000}
    constraints: {deadline: 24h, currency: USD}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuplan.errors import SpecError
from gpuplan.schema_base import UserModel
from gpuplan.units import parse_duration_s
from gpuplan.userfile import parse_yaml, path_kind, read_yaml

Method = Literal["full", "lora", "qlora"]
Precision = Literal[
    "fp32", "tf32", "fp16-mixed", "bf16-mixed", "fp16-true", "bf16-true", "fp8-mixed"
]
Optimizer = Literal["adamw", "adamw-8bit", "sgd", "sgd-momentum", "adafactor", "lion"]
Checkpointing = Literal["none", "selective", "selective-op", "full"]
Offload = Literal["none", "optimizer", "optimizer+params"]
Sharding = Literal["none", "zero1", "zero2", "zero3", "fsdp", "hsdp"]
TpCommOverlap = Literal["auto", "none", "backward", "pipelined"]
Framework = Literal[
    "hf", "torchtune", "litgpt", "deepspeed", "megatron", "torchtitan", "llmfoundry", "apex"
]

#: The hardware dtype each precision mode computes its matmuls in.
COMPUTE_DTYPE: dict[str, str] = {
    "fp32": "fp32",
    "tf32": "tf32",
    "fp16-mixed": "fp16",
    "bf16-mixed": "bf16",
    "fp16-true": "fp16",
    "bf16-true": "bf16",
    "fp8-mixed": "fp8",
}


class _Spec(UserModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LoraSpec(_Spec):
    """LoRA adapter settings (used when ``method`` is lora or qlora)."""

    rank: int = Field(default=16, ge=1, le=4096, description="Adapter rank r.")
    alpha: float = Field(default=32, gt=0, description="Scaling numerator (scale = alpha / rank).")
    targets: tuple[str, ...] = Field(
        default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        min_length=1,
        description="Module names to adapt, or ['all-linear'].",
    )
    dropout: float = Field(default=0.0, ge=0, lt=1, description="LoRA dropout (PEFT default 0).")
    double_quant: bool = Field(
        default=True, description="QLoRA: double-quantize the NF4 absmax constants."
    )
    bitsandbytes: str | None = Field(
        default=None,
        pattern=r"^\d+\.\d+(\.\d+)?$",
        description=(
            "QLoRA: the bitsandbytes release the job runs, e.g. '0.42.0' (default: a current "
            "one). Before 0.43.2, MatMul4Bit keeps each 4-bit linear's input as a context "
            "attribute (bitsandbytes PR #1270) that lives as long as the autograd graph; a "
            "training loop that holds the previous step's output (litgpt) then keeps those "
            "inputs through the next forward."
        ),
    )
    peft: str | None = Field(
        default=None,
        pattern=r"^\d+\.\d+(\.\d+)?$",
        description=(
            "framework hf: the PEFT release the job runs, e.g. '0.10.0' (default: a current one). "
            "From 0.12, get_peft_model keeps the adapters in fp32 on a 16-bit base "
            "(autocast_adapter_dtype=True) and casts each adapted linear's input to fp32; before "
            "0.12 the adapters took the base weight's dtype."
        ),
    )


class DeepSpeedSpec(_Spec):
    """DeepSpeed settings that change how a rank communicates (framework: deepspeed only)."""

    version: str | None = Field(
        default=None,
        pattern=r"^\d+\.\d+(\.\d+)?$",
        description=(
            "The DeepSpeed release the job runs, e.g. '0.3.16' (default: a current one). From "
            "ZeRO-3's first release (0.3.13) until 0.6.0, ZeRO-3 fetched each parameter with "
            "its own all-gather into a list of one partition per rank, which PyTorch copies out "
            "one by one, and the prefetch synchronized the device before each "
            "(partition_parameters.py, _allgather_param): per parameter a ring's latency and "
            "one copy per rank, none of it hidden behind compute. 0.6.0 gathers a module's "
            "parameters in one coalesced call. From 0.6.0 ZeRO-3 also allocates its gradient "
            "partition at init (grad_partitions_flat_buffer)."
        ),
    )
    reduce_bucket_size: float | None = Field(
        default=None,
        gt=0,
        le=1e12,
        description="zero_optimization.reduce_bucket_size, in elements (default 5e8): the 16-bit "
        "gradient reduction bucket every ZeRO stage keeps.",
    )
    stage3_prefetch_bucket_size: float | None = Field(
        default=None,
        gt=0,
        le=1e12,
        description="zero_optimization.stage3_prefetch_bucket_size, in elements (default 5e7): "
        "parameters ZeRO-3 gathers ahead of the module that runs.",
    )
    stage3_max_live_parameters: float | None = Field(
        default=None,
        gt=0,
        le=1e13,
        description="zero_optimization.stage3_max_live_parameters, in elements (default 1e9): "
        "the most gathered parameters ZeRO-3 keeps at once.",
    )
    sub_group_size: float | None = Field(
        default=None,
        gt=0,
        le=1e13,
        description="zero_optimization.sub_group_size, in elements (default 1e9): ZeRO-3 steps "
        "the optimizer one sub-group at a time, materialising its fp32 gradient.",
    )
    overlap_comm: bool | None = Field(
        default=None,
        description="zero_optimization.overlap_comm (default: on for ZeRO-3, off for stages "
        "0-2, DeepSpeedZeroConfig.overlap_comm_valid). Off, the gradient reduction is not "
        "hidden behind backward: stage 2 reduces each full bucket on the compute stream, "
        "stages 0 and 1 after backward. On, stages 1 and 2 keep two reduction buckets. Stage 1 "
        "ignores it before DeepSpeed 0.13.0 (see deepspeed.version).",
    )

    @field_validator("version", mode="before")
    @classmethod
    def _deepspeed_release(cls, value: Any) -> Any:
        return _quoted_release(value)


class MegatronSpec(_Spec):
    """Megatron-Core settings that change what a rank keeps (framework: megatron only)."""

    fp8_params: bool = Field(
        default=False,
        description="Transformer Engine keeps the weights in fp8 (`fp8_params` / "
        "`fp8_param_gather`): 1 byte per parameter instead of bf16 plus an fp8 copy; the main "
        "parameters stay in the optimizer. Needs precision fp8-mixed.",
    )
    grad_reduce_in_fp32: bool | None = Field(
        default=None,
        description="fp32 main-gradient buffer; false: the gradients are kept and reduced in the "
        "16-bit dtype (`grad_reduce_in_fp32: false`, as NVIDIA's FP8 recipes set), and the "
        "optimizer step makes an fp32 copy of them (`.float()` in "
        "`_copy_model_grads_to_main_grads`). Unset: Megatron's default, "
        "--accumulate-allreduce-grads-in-fp32, which --bf16 turns on (arguments.py) and fp16 "
        "leaves off: true except under precision fp16-mixed.",
    )
    legacy_local_ddp: bool = Field(
        default=False,
        description="Megatron-LM v2 before July 2021 (up to the v2.5 tag) with its local DDP "
        "and no contiguous gradient buffers (use_contiguous_buffers_in_ddp false, then the "
        "default): each parameter's main_grad still points at the previous step's 16-bit "
        "gradient through forward and backward, and the fp32 main gradients the optimizer "
        "copies stay until the next step (Float16OptimizerWithFloat16Params.zero_grad cleared "
        "only the 16-bit groups), 6 bytes per parameter more. Needs sharding none (no "
        "distributed optimizer then) and 16-bit gradients.",
    )
    optimizer_dtype: Literal["fp32", "bf16"] = Field(
        default="fp32",
        description="Main parameters and Adam moments: fp32, or bf16 (Apex "
        "DistributedFusedAdam with `dtype: bf16`, as NeMo's SFT recipes set).",
    )
    param_remainders: bool = Field(
        default=False,
        description="The main parameters are kept as the 16 bits a bf16 parameter lacks "
        "(Apex DistributedFusedAdam `store_param_remainders`, which NeMo 1.x's "
        "`distributed_fused_adam` sets for bf16 models with an fp32 optimizer): 2 bytes per "
        "parameter in the optimizer shard instead of 4. Needs optimizer_dtype fp32 and 16-bit "
        "parameters (not fp8_params).",
    )
    fp8_dot_product_attention: bool = Field(
        default=False,
        description="Transformer Engine runs attention in fp8 (`fp8_dot_product_attention`, "
        "NeMo/MLPerf FP8_DPA=1, with the default NVTE_FP8_DPA_BWD=1): it keeps q, k, v and its "
        "output for backward as their fp8 casts, 1 byte each instead of 2. Memory only: the "
        "time model keeps attention at its 16-bit speed. Needs precision fp8-mixed.",
    )
    activation_func_fp8_input_store: bool = Field(
        default=False,
        description="The fused SwiGLU/GeGLU keeps its input for backward in fp8 e4m3 "
        "(`activation_func_fp8_input_store`, NeMo/MLPerf FP8_ACT=1): 1 byte per element "
        "instead of 2.",
    )
    cross_entropy_fusion: Literal["none", "native", "te"] = Field(
        default="none",
        description="The LM loss kernel (`cross_entropy_loss_fusion` with "
        "`cross_entropy_fusion_impl`; Megatron-LM's default is none, Megatron-Bridge's GPT and "
        "Llama providers set te). none and native upcast the logits and keep the fp32 softmax, "
        "whose backward writes the gradient in place; te (Transformer Engine's "
        "`parallel_cross_entropy`, releases up to 2.17) writes the gradient into the 16-bit "
        "logits during forward and keeps only them.",
    )
    activation_offload_layers: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="Transformer layers whose activations go to host memory "
        "(`cpu_offloading_num_layers`): the first N layers' go to the host, and at the start of "
        "backward one of them is reloaded while the kept layers are still held (Transformer "
        "Engine 2.9's group offload handler).",
    )


class ParallelismSpec(_Spec):
    """An explicit parallel strategy; data parallelism fills the remaining GPUs."""

    sharding: Sharding = Field(
        default="none",
        description="What is split over the data-parallel ranks; the meaning per `framework` "
        "is read from that engine's code (gpuplan.estimate.sharding). zero1: optimizer state "
        "(hf/torchtune/litgpt: fp32 params and grads kept whole under autocast; deepspeed: "
        "2 + 2 + 12/N bytes per param; megatron: the distributed optimizer, 2 + 4 + 12/N; not "
        "in torchtitan). zero2: gradients too (deepspeed 2 + 2/N + 12/N; megatron-FSDP "
        "optim_grads; hf/torchtune/litgpt: FSDP SHARD_GRAD_OP, parameters sharded as well, "
        "the stage's gathered parameters kept from forward to backward; torchtitan: FSDP2 "
        "without resharding after forward). zero3 = fsdp: "
        "parameters too, gathered layer by layer (deepspeed (2+2+12)/N; megatron-FSDP; "
        "torchtitan FSDP2: fp32 shards gathered in bf16, fp32 grads, 16/N). hsdp: fsdp within "
        "a node, replicated across nodes.",
    )
    tp: int = Field(default=1, ge=1, le=512, description="Tensor-parallel degree.")
    pp: int = Field(default=1, ge=1, le=512, description="Pipeline-parallel degree.")
    vp: int = Field(
        default=1,
        ge=1,
        le=128,
        description="Virtual pipeline stages per GPU (interleaved 1F1B); divides the bubble by vp. "
        "Where the layers split over the pp x vp chunks only with the embedding and the loss "
        "counted as a layer each (Llama-3.1-405B's 126 layers on 64 or 128 chunks), the chunks "
        "beside them hold one layer fewer, as Megatron's "
        "--account-for-embedding/loss-in-pipeline-split place them.",
    )
    cp: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Context-parallel degree (Megatron-Core / Transformer Engine ring "
        "attention): each rank holds seq_len / cp tokens of every sequence and passes K/V "
        "around the ring; the cp ranks share the weights like data-parallel ranks. seq_len "
        "must divide by 2 x cp (load-balanced causal chunks). Not tried by parallelism: auto.",
    )
    ep: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Expert-parallel degree (mixture-of-experts models; Megatron-Core's "
        "`--expert-model-parallel-size`, expert tensor parallelism equal to tp): each rank holds "
        "num_experts / ep of every layer's experts (split over tp as well), the ep ranks are "
        "carved from the data x context parallel ranks and exchange each MoE layer's routed "
        "tokens by all-to-all (dispatch and combine, forward and backward, exposed); the "
        "experts' gradients are reduced, and their sharded state split, over the dp x cp / ep "
        "ranks that hold the same experts. ep must divide num_experts and dp x cp.",
    )
    sequence_parallel: bool = Field(
        default=True,
        description="With tp > 1, whether the activations outside the tensor-parallel region "
        "(norm inputs, the inputs of the column-parallel QKV and MLP-up linears, residual "
        "dropout masks, checkpointed layer inputs) are split over the tp ranks by sequence "
        "(Megatron's --sequence-parallel, on in NeMo's and Megatron-Bridge's recipes and "
        "torchtitan's TP plan) or kept whole on every rank (false: Megatron-LM's default, "
        "Megatron before 2022, PyTorch TP plans without SequenceParallel). Memory keeps them "
        "whole and time repeats their norm and dropout work on every rank; the layout search "
        "assumes true. Under torchtitan (DTensor) the column-parallel linears save their "
        "all-gathered input even with it on; only the norms' tensors are split.",
    )
    overlap_grad_reduce: bool | None = Field(
        default=None,
        description="Whether the data-parallel gradient reduction (and a sharded optimizer's "
        "parameter all-gather) runs beside backward. Unset: it does, up to the efficiency "
        "file's data_parallel (fsdp) fraction, as PyTorch DDP's gradient buckets, FSDP and "
        "Megatron's --overlap-grad-reduce run it. false: it all runs after backward, exposed: "
        "Megatron-LM without --overlap-grad-reduce (its default), Apex's DistributedFusedLAMB "
        "without overlap_reductions (NVIDIA's MLPerf BERT, whose logs print "
        "dwu_overlap_reductions=False), --allreduce_post_accumulation, DDP with one bucket for "
        "the whole model. Under framework deepspeed, deepspeed.overlap_comm decides instead.",
    )
    tp_comm_overlap: TpCommOverlap = Field(
        default="auto",
        description="With tp > 1, which tensor-parallel collectives run while a GEMM computes. "
        "none: every all-reduce (all-gather, reduce-scatter) is waited on (Megatron-LM before "
        "September 2021, the SC21 paper's code; PyTorch DTensor plans). backward: the "
        "column-parallel linears' input-gradient all-reduce (reduce-scatter under sequence "
        "parallelism) runs during their weight-gradient GEMM, forward and recompute "
        "collectives are waited on (Megatron-LM's async all-reduce since 2021-09, "
        "`LinearWithGradAccumulationAndAsyncCommunication`, the Megatron-Core default). "
        "pipelined: every collective is split and overlapped with the GEMMs (Transformer "
        "Engine userbuffers, `--tp-comm-overlap`, as NeMo's and Megatron-Bridge's recipes set; "
        "torchtitan's async TP). Overlapped collectives are hidden up to the efficiency file's "
        "tensor_parallel fraction. auto: none under torchtitan (DTensor), pipelined otherwise.",
    )


_SCIENTIFIC = re.compile(r"[0-9][0-9_]*(\.[0-9_]*)?[eE][+-]?[0-9]+")


class WorkSpec(_Spec):
    """How much training to do: exactly one of tokens, samples (with epochs), or steps."""

    tokens: int | None = Field(
        default=None, gt=0, description="Training tokens in total (1e9 or 2.5e9 is fine)."
    )
    samples: int | None = Field(default=None, gt=0, description="Dataset size in samples.")
    epochs: float | None = Field(default=None, gt=0, description="Passes over `samples`.")
    steps: int | None = Field(default=None, gt=0, description="Optimizer steps.")
    eval_samples: int | None = Field(
        default=None,
        ge=0,
        description="Samples evaluated (forward only) over the whole run, e.g. 8 validation "
        "passes of 173 samples = 1384; their time is added to time_to_train.",
    )
    evaluations: float | None = Field(
        default=None,
        gt=0,
        le=1e6,
        description="How many evaluation passes eval_samples is split into (default 1; a mean "
        "over runs may be fractional; at most eval_samples). Each pass rounds its last "
        "micro-batch up and fills the pipeline stages again.",
    )

    @field_validator("tokens", "samples", "steps", "eval_samples", mode="before")
    @classmethod
    def _scientific_count(cls, value: object) -> object:
        """YAML reads ``1e9`` and ``2.5e9`` as strings (its floats need a dot and a signed
        exponent): take them, and integral floats, as the whole numbers they write."""
        if isinstance(value, str) and _SCIENTIFIC.fullmatch(value.strip()):
            number = float(value.replace("_", ""))
            return int(number) if number.is_integer() else value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> WorkSpec:
        given = [k for k in ("tokens", "samples", "steps") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of {tokens: N}, {samples: N, epochs: E}, {steps: N}")
        if self.epochs is not None and self.samples is None:
            raise ValueError("epochs needs samples")
        if self.evaluations is not None and not self.eval_samples:
            raise ValueError("evaluations needs eval_samples (the samples they evaluate in all)")
        if (
            self.evaluations is not None
            and self.eval_samples
            and self.evaluations > self.eval_samples
        ):
            raise ValueError(
                f"evaluations ({self.evaluations:g}) is more than eval_samples "
                f"({self.eval_samples}): each pass evaluates at least one sample"
            )
        return self


Duration = float


class ConstraintsSpec(_Spec):
    """What a plan must satisfy."""

    deadline: Duration | None = Field(default=None, description="Wall-clock limit, e.g. 24h or 7d.")
    budget: float | None = Field(default=None, gt=0, description="Total cost limit in `currency`.")
    currency: str = Field(
        default="USD", pattern=r"^[A-Z]{3}$", description="Currency of budget and costs."
    )
    providers: tuple[str, ...] = Field(default=(), description="Allowed providers (empty = all).")
    regions: tuple[str, ...] = Field(
        default=(), description="Allowed regions, substrings (empty = all)."
    )
    compliance: tuple[str, ...] = Field(
        default=(), description="Required compliance tags, e.g. mlps-3."
    )
    billing: tuple[str, ...] = Field(default=(), description="Allowed billing modes (empty = all).")
    max_gpus: int | None = Field(default=None, ge=1, description="Most GPUs in total.")
    bare_metal_only: bool = Field(default=False, description="Only bare-metal instances.")

    @field_validator("deadline", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is None:
            return None
        seconds = parse_duration_s(value, field="constraints.deadline")
        if seconds <= 0:
            raise ValueError(f"constraints.deadline: must be longer than 0, got {value!r}")
        return seconds

    @field_validator("billing")
    @classmethod
    def _billing_modes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from gpuplan.catalog.schema import BILLING_MODES

        for mode in value:
            if mode not in BILLING_MODES:
                raise ValueError(
                    f"unknown billing mode {mode!r}; allowed: {', '.join(BILLING_MODES)}"
                )
        return value

    @field_validator("providers", "compliance")
    @classmethod
    def _lower(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(v.lower() for v in value)


class DataSourceSpec(_Spec):
    """Where a dataset lives (a catalog provider and region)."""

    provider: str = Field(description="Provider id, e.g. aws.")
    region: str = Field(description="Region, e.g. us-east-1.")


class DataSpec(_Spec):
    """Data the job moves and stores (decimal GB); costs transfer and storage."""

    dataset_gb: float = Field(default=0.0, ge=0, description="Dataset copied to the GPUs' region.")
    source: DataSourceSpec | None = Field(
        default=None, description="Where the dataset lives (default: outside the clouds)."
    )
    checkpoint_gb: float = Field(
        default=0.0, ge=0, description="Checkpoints stored during the job."
    )
    results_gb: float = Field(default=0.0, ge=0, description="Outputs copied out after the job.")


class JobSpec(_Spec):
    """A training workload: model, method, numerics, batch, parallelism, work and constraints."""

    model: str = Field(
        description="Preset id (see `gpuplan models`) or a path to a HF config.json."
    )
    method: Method = Field(default="full", description="full fine-tune/pretrain, lora or qlora.")
    lora: LoraSpec | None = Field(default=None, description="LoRA settings (lora/qlora).")
    precision: Precision = Field(default="bf16-mixed", description="Numerics of the training step.")
    optimizer: Optimizer = Field(default="adamw", description="Optimizer (its state sizes differ).")
    micro_batch_size: int = Field(
        default=1, ge=1, le=65536, description="Samples per GPU per forward."
    )
    global_batch_size: int | None = Field(
        default=None,
        ge=1,
        description="Samples per optimizer step across all GPUs (default: no accumulation).",
    )
    seq_len: int | None = Field(
        default=None, ge=1, le=10_000_000, description="Tokens per sample (text)."
    )
    mean_seq_len: int | None = Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="Mean tokens per sample of unpadded data (dynamic padding, no packing): time "
        "is sized by it, memory by seq_len (the longest sample). With packing: the mean document "
        "length, which attention (per document) is sized by.",
    )
    packing: bool = Field(
        default=False,
        description="Samples packed into rows of seq_len tokens (a sample, the batch sizes and "
        "work.samples then count rows): every row is full, so linear layers cost seq_len tokens "
        "and memory is sized by seq_len; attention stays within each document (mean_seq_len, "
        "when given).",
    )
    image_size: int | None = Field(
        default=None, ge=8, le=8192, description="Image side in pixels (vision)."
    )
    cnn_kernels: Literal["eager", "channels-last", "fused"] = Field(
        default="eager",
        description="How a CNN's kernels run (CNN models only). eager: PyTorch's default, "
        "NCHW tensors with batch norm, ReLU and residual adds as separate kernels, and cuDNN "
        "transposing NCHW to NHWC around each tensor-core convolution (16-bit and TF32); "
        "channels-last: the same kernels on NHWC tensors (`memory_format=torch.channels_last`), "
        "no transposes; fused: NHWC with batch norm, ReLU and adds fused into the convolutions "
        "(NVIDIA's MLPerf ResNet with cuDNN fusions, or a fusing compiler).",
    )
    fused_kernels: bool | None = Field(
        default=None,
        description="The transformer's norms and gated activation run as fused kernels "
        "(Liger Kernel, flash-attn's rms_norm/layer_norm, xformers' or Apex's SwiGLU, as "
        "TinyLlama and many fine-tuning stacks run them; Transformer Engine under megatron): a "
        "norm keeps its input, in the residual stream's dtype, and its fp32 statistics, not "
        "fp32 copies; the gated MLP keeps its gate and up outputs, not the activation's output, "
        "and a GELU its input, not the tanh formula's intermediates; "
        "grouped-query K/V reach the attention kernel unrepeated. Stated, it also prices the "
        "step's element-wise traffic over what the kernels keep and the fused kernel count. "
        "Default: the "
        "framework's (megatron: yes; the others: no).",
    )
    activation_checkpointing: Checkpointing = Field(
        default="none",
        description="Recompute in backward: selective (Megatron: the attention core), "
        "selective-op (torchtitan's per-op policy: keeps attention outputs and every other "
        "matmul output; fp8 matmuls are recomputed) or full (whole layers).",
    )
    offload: Offload = Field(
        default="none",
        description="CPU offload of optimizer state / params. Under framework deepspeed "
        "(ZeRO-Offload) stages 2 and 3 send the gradients to the host too, as each bucket is "
        "reduced; stage 1 keeps them on the GPU until backward ends, unless overlap_comm "
        "(from DeepSpeed 0.13.0) with one micro-batch a step sends them as stage 2 does.",
    )
    framework: Framework = Field(
        default="hf",
        description="Training code and engine: hf (transformers Trainer/PEFT, PyTorch "
        "DDP/FSDP under autocast), torchtune or litgpt (they differ in loss chunking, norms and "
        "GELU), deepspeed (DeepSpeed ZeRO around HF model code: 16-bit params and grads, fp32 "
        "master weights sharded with the optimizer state), megatron (Megatron-LM / NeMo / "
        "Megatron-Bridge: distributed optimizer, Transformer Engine kernels, fp32 main grads) "
        "torchtitan (FSDP2: fp32 sharded params gathered in bf16; DTensor tensor parallelism: "
        "gathered linear inputs saved, loss_parallel, collectives not overlapped) or "
        "llmfoundry (MosaicML "
        "llm-foundry: FSDP with 16-bit compute params, low-precision LayerNorm, flash-attn's "
        "fused cross-entropy) or apex (NVIDIA Apex amp O2, as NVIDIA's DeepLearningExamples "
        "run it: fp16 model weights and gradients, fp32 master weights and Adam moments in the "
        "optimizer, no autocast; sharding none only). It decides what each "
        "`parallelism.sharding` value keeps per parameter. Not stated: hf, except that a "
        "stated layout with pipeline stages (parallelism.pp > 1) is read as megatron, since "
        "Transformers has no pipeline engine (unless hf_trainer, optimizer_in_backward or "
        "paged_optimizer asks for a PyTorch training loop); the estimate says so. "
        "`parallelism: auto` compares its layouts under one engine, hf unless stated.",
    )
    pytorch_version: str | None = Field(
        default=None,
        pattern=r"^\d+\.\d+(\.\d+)?$",
        description="The PyTorch release the job runs, e.g. '1.13.1' (default: a current one). "
        "From 2.1, torch.utils.checkpoint's non-reentrant implementation stops recomputing a "
        "checkpointed block once every tensor its backward saved is back "
        "(set_checkpoint_early_stop, default on): in a pre-norm decoder layer the last "
        "projection's output is never saved, so its GEMM is not run again. It applies under "
        "frameworks whose checkpointing is that implementation (torchtune, torchtitan, "
        "llmfoundry); Megatron's, DeepSpeed's and Hugging Face's default (reentrant) "
        "checkpointing recompute the whole forward.",
    )
    hf_trainer: bool = Field(
        default=False,
        description="The step runs in Hugging Face's Trainer or a subclass (TRL's SFTTrainer, "
        "LLaMA-Factory's): Trainer.compute_loss returns the loss alone, so the model output "
        "and its 16-bit logits are freed before training_step calls backward. Off: a loop that "
        "keeps `outputs` through backward, which holds them. Hugging Face model code only "
        "(framework hf or deepspeed).",
    )
    gradient_clipping: bool | None = Field(
        default=None,
        description="Whether each step clips the gradients by their global norm: a norm pass and "
        "a scaling pass over every gradient a rank holds (time, not memory). Unset: the "
        "framework's default: on under Hugging Face's Trainer (hf_trainer; max_grad_norm 1.0), "
        "megatron (--clip-grad 1.0) and torchtitan (max_norm 1.0); off under deepspeed "
        "(gradient_clipping 0) and the other loops.",
    )
    compile: bool = Field(
        default=False,
        description="torch.compile: pointwise intermediates are recomputed (memory); element-wise "
        "kernels are fused and the step pays at most the compiled models' fitted step overhead "
        "(efficiency.yaml compiled.step_overhead) instead of its architecture's (time).",
    )
    compile_loss: bool | None = Field(
        default=None,
        description="Whether the loss (the logits' upcast, log-softmax and their backward) "
        "is compiled too; default: as `compile`. torchtitan's `compile.components` "
        "(['model', 'loss'] since 2025); before that torchtitan compiled the transformer "
        "blocks only and ran the loss eagerly, keeping its fp32 logits.",
    )
    optimizer_impl: Literal["auto", "foreach", "fused", "for-loop"] = Field(
        default="auto",
        description="Optimizer kernel: foreach (torch's CUDA default, one parameter-sized temporary), "
        "fused, or a per-parameter loop (Hugging Face's adamw_hf, foreach=False: a kernel per op "
        "per tensor, so small tensors cost their launches).",
    )
    optimizer_in_backward: bool = Field(
        default=False,
        description="Each parameter's optimizer step runs in backward as soon as its gradient "
        "is accumulated, and the gradient is freed (torchtune optimizer_in_bwd, PyTorch "
        "register_post_accumulate_grad_hook): only one parameter's gradient exists at a time. "
        "Needs no gradient accumulation (global batch = micro-batch x data-parallel ranks); "
        "PyTorch engines only (hf, torchtune, litgpt, torchtitan, llmfoundry).",
    )
    paged_optimizer: bool = Field(
        default=False,
        description="bitsandbytes paged optimizer (PagedAdamW, PagedAdamW8bit, PagedLion): "
        "the state of every parameter of 1e5 elements or more lives in CUDA unified memory, "
        "outside PyTorch's allocator, and pages out to the host when the GPU is full. "
        "Optimizers adamw, adamw-8bit and lion.",
    )
    cublas_workspace_config: str | None = Field(
        default=None,
        description="The run's CUBLAS_WORKSPACE_CONFIG (':SIZE:COUNT' pairs, SIZE in KiB), which "
        "sizes the workspace PyTorch allocates for each of its two cuBLAS handles "
        "(aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize): deterministic "
        "runs set ':4096:8' (32 MiB), as Megatron's functional tests do. Unset: PyTorch's "
        "default, 32 MiB on compute capability 9.x and later, ':4096:2:16:8' (8.125 MiB) before.",
    )
    deepspeed: DeepSpeedSpec | None = Field(
        default=None,
        description="framework deepspeed only: {version}, the DeepSpeed release (its ZeRO-3 "
        "gathers changed in 0.6.0).",
    )
    megatron: MegatronSpec | None = Field(
        default=None,
        description="framework megatron only: {fp8_params, grad_reduce_in_fp32, "
        "optimizer_dtype, param_remainders, fp8_dot_product_attention, "
        "activation_func_fp8_input_store, cross_entropy_fusion, activation_offload_layers}, the "
        "Megatron-Core "
        "and NeMo settings that change what each rank keeps.",
    )
    loss_chunks: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="Chunks the LM head and loss run in (1 = the whole logits tensor at once); "
        "default: the framework's (torchtune 8, litgpt 16, the others 1).",
    )
    loss_kernel: Literal["auto", "eager", "fused", "fused-linear"] = Field(
        default="auto",
        description="How the LM head's loss runs (decoders). eager: log-softmax and NLL in "
        "PyTorch, an fp32 copy of the logits kept for backward; fused: a fused cross-entropy "
        "(flash-attn's, Liger Kernel's LigerCrossEntropyLoss) keeps the 16-bit logits and an "
        "fp32 logsumexp, and its backward writes a 16-bit gradient; fused-linear: the LM head "
        "and the loss fused and chunked (Liger Kernel's LigerFusedLinearCrossEntropyLoss, "
        "Apple's cut-cross-entropy): no logits are kept, only the hidden state's gradient, "
        "computed in forward. Stated fused or fused-linear, the step reads the 16-bit logits and "
        "writes their gradient once instead of three fp32 passes. auto: the framework's "
        "(llmfoundry fused, the others eager; under megatron, megatron.cross_entropy_fusion "
        "decides instead), in memory only: the time keeps the eager passes.",
    )
    zero_grad: Literal["set_to_none", "zeros"] = Field(
        default="set_to_none",
        description="How gradients are cleared between steps: set_to_none (freed, so they are "
        "not there during the next forward; the default since PyTorch 2.0) or zeros (kept "
        "allocated and zeroed: zero_grad() before PyTorch 2.0, as in the HF Trainer of 2022).",
    )
    attention: Literal["auto", "fused", "cudnn", "eager"] = Field(
        default="auto",
        description="Attention kernel: fused (flash / memory-efficient SDPA: FlashAttention-2 "
        "class), cudnn (cuDNN / FlashAttention-3 class, as Transformer Engine in NeMo and "
        "Megatron: faster on Hopper and later) or eager (materialised s x s scores). auto: what "
        "current PyTorch SDPA picks, cudnn on sm90/sm100 datacenter GPUs (PyTorch >= 2.9 with "
        "cuDNN >= 9.15) and fused elsewhere; eager where no kernel takes the job (Gemma 2's "
        "soft-capped scores under litgpt; grouped K/V in fp32 or tf32 under hf or deepspeed, "
        "which transformers hands to SDPA with enable_gqa: its math backend).",
    )
    parallelism: Literal["auto"] | ParallelismSpec = Field(
        default="auto",
        description="'auto' (search tensor x pipeline (with vp) x data parallelism, sharding, "
        "checkpointing and micro-batch for the fastest layout that fits, keeping "
        "global_batch_size) or {sharding, tp, pp, vp}.",
    )
    work: WorkSpec | None = Field(
        default=None, description="{tokens}, {samples, epochs} or {steps}."
    )
    constraints: ConstraintsSpec = Field(default_factory=ConstraintsSpec)
    data: DataSpec | None = Field(
        default=None, description="Dataset/checkpoint sizes for transfer and storage costs."
    )

    @field_validator("pytorch_version", mode="before")
    @classmethod
    def _pytorch_release(cls, value: Any) -> Any:
        return _quoted_release(value)

    @field_validator("cublas_workspace_config")
    @classmethod
    def _cublas_config(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"(:[0-9]{1,7}:[0-9]{1,4})+", v):
            shown = repr(v) if len(v) <= 40 else repr(v[:40]) + "..."
            raise ValueError(f"{shown} is not ':SIZE:COUNT' pairs (SIZE in KiB), e.g. ':4096:8'")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.hf_trainer and self.framework not in ("hf", "deepspeed"):
            raise ValueError(
                f"hf_trainer: true runs Hugging Face model code (framework hf or deepspeed), "
                f"not framework {self.framework}"
            )
        if self.method in ("lora", "qlora") and self.lora is None:
            object.__setattr__(self, "lora", LoraSpec())
        if self.seq_len is not None and self.image_size is not None:
            raise ValueError("give seq_len (text) or image_size (vision), not both")
        if self.global_batch_size is not None and self.global_batch_size % self.micro_batch_size:
            raise ValueError(
                "global_batch_size must be a multiple of micro_batch_size "
                f"({self.global_batch_size} % {self.micro_batch_size} != 0); nearest valid: "
                + ", ".join(
                    map(str, nearest_multiples(self.global_batch_size, self.micro_batch_size))
                )
            )
        if self.paged_optimizer and self.optimizer not in ("adamw", "adamw-8bit", "lion"):
            raise ValueError(
                f"paged_optimizer: bitsandbytes pages adamw, adamw-8bit and lion, not "
                f"{self.optimizer}"
            )
        for field, on in (
            ("optimizer_in_backward", self.optimizer_in_backward),
            ("paged_optimizer", self.paged_optimizer),
        ):
            if on and self.framework in ("deepspeed", "megatron", "apex"):
                raise ValueError(
                    f"{field}: {self.framework}'s engine runs its own optimizer step; allowed "
                    "with hf, torchtune, litgpt, torchtitan and llmfoundry"
                )
        if self.paged_optimizer and self.offload != "none":
            raise ValueError("paged_optimizer: give it or offload, not both")
        if self.deepspeed is not None and self.framework != "deepspeed":
            raise ValueError(
                f"deepspeed: its settings apply to framework deepspeed only, not {self.framework}"
            )
        ds_version = self.deepspeed.version if self.deepspeed is not None else None
        if (
            ds_version is not None
            and release(ds_version) < DS_FIRST_ZERO3
            and isinstance(self.parallelism, ParallelismSpec)
            and self.parallelism.sharding in ("zero3", "fsdp", "hsdp")
        ):
            raise ValueError(
                f"deepspeed.version: {ds_version} has no ZeRO-3 (first in 0.3.13); use sharding "
                "zero1 or zero2, or a later release"
            )
        if self.loss_kernel != "auto" and self.framework == "megatron":
            raise ValueError(
                "loss_kernel: under framework megatron, megatron.cross_entropy_fusion decides "
                "the loss; allowed with megatron: auto"
            )
        if self.fused_kernels is False and self.framework == "megatron":
            raise ValueError(
                "fused_kernels: megatron runs Transformer Engine's fused kernels; allowed with "
                "framework megatron: true or unset"
            )
        if self.megatron is not None and self.framework != "megatron":
            raise ValueError(
                f"megatron: its settings apply to framework megatron only, not {self.framework}"
            )
        if (
            self.megatron is not None
            and self.megatron.fp8_params
            and self.precision != ("fp8-mixed")
        ):
            raise ValueError(
                f"megatron.fp8_params: needs precision fp8-mixed, not {self.precision}"
            )
        if (
            self.megatron is not None
            and self.megatron.fp8_dot_product_attention
            and self.precision != "fp8-mixed"
        ):
            raise ValueError(
                "megatron.fp8_dot_product_attention: needs precision fp8-mixed, not "
                f"{self.precision}"
            )
        if self.megatron is not None and self.megatron.legacy_local_ddp:
            sharding = (
                self.parallelism.sharding if isinstance(self.parallelism, ParallelismSpec) else None
            )
            if sharding != "none":
                raise ValueError(
                    "megatron.legacy_local_ddp: Megatron-LM v2 had no distributed optimizer; "
                    "needs an explicit parallelism with sharding none"
                )
            if self.megatron.grad_reduce_in_fp32 or self.precision != "fp16-mixed":
                raise ValueError(
                    "megatron.legacy_local_ddp: needs 16-bit gradients (precision fp16-mixed, "
                    "grad_reduce_in_fp32 unset or false)"
                )
        if self.megatron is not None and self.megatron.param_remainders:
            if self.megatron.optimizer_dtype != "fp32" or self.megatron.fp8_params:
                raise ValueError(
                    "megatron.param_remainders: needs optimizer_dtype fp32 and 16-bit "
                    "parameters (fp8_params false)"
                )
            if self.precision not in ("bf16-mixed", "fp8-mixed"):
                raise ValueError(
                    "megatron.param_remainders: needs bf16 parameters (precision bf16-mixed "
                    f"or fp8-mixed), not {self.precision}"
                )
        if (
            isinstance(self.parallelism, ParallelismSpec)
            and self.parallelism.overlap_grad_reduce is not None
            and self.framework == "deepspeed"
        ):
            raise ValueError(
                "parallelism.overlap_grad_reduce: under framework deepspeed the reduction "
                "follows deepspeed.overlap_comm; set that instead"
            )
        if (self.mean_seq_len is not None or self.packing) and self.seq_len is None:
            raise ValueError(
                "mean_seq_len and packing describe text data: give seq_len (the longest sample, "
                "or the packed row length) too"
            )
        if (
            self.mean_seq_len is not None
            and self.seq_len is not None
            and self.mean_seq_len > self.seq_len
        ):
            raise ValueError(
                f"mean_seq_len: {self.mean_seq_len} exceeds seq_len {self.seq_len} (the "
                "longest sample, which memory is sized by)"
            )
        self._batch_within_work()
        return self

    def _batch_within_work(self) -> None:
        """A step may not hold more samples than the whole job (that answer is silently wrong)."""
        work = self.work
        if work is None or work.steps is not None:
            return
        if work.samples is not None:
            job = work.samples * (work.epochs or 1.0)
            source = "work.samples" + (" x work.epochs" if work.epochs is not None else "")
        elif work.tokens is not None and self.seq_len is not None:
            job = work.tokens / self.seq_len
            source = "work.tokens / seq_len"
        else:
            return
        batch = self.global_batch_size
        if batch is not None and batch > job:
            raise ValueError(
                f"global_batch_size: {batch:,} samples per step is more than the whole job "
                f"({source} = {job:,.0f} samples); lower it or give more work"
            )

    @property
    def compute_dtype(self) -> str:
        """The hardware dtype of the step's matmuls (bf16, fp16, fp8, tf32, fp32)."""
        return COMPUTE_DTYPE[self.precision]


def _quoted_release(value: Any) -> Any:
    """A release written as a YAML number loses its trailing zeros (2.10 reads as 2.1): ask
    for it quoted rather than guess."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(
            f"write the release quoted, e.g. '{value}' (a YAML number drops trailing zeros: "
            "2.10 reads as 2.1)"
        )
    return value


def release(text: str) -> tuple[int, ...]:
    """A dotted release string ('0.43.2') as a comparable tuple (the spec's pattern checks it)."""
    return tuple(int(part) for part in text.split("."))


DS_FIRST_ZERO3 = (0, 3, 13)
"""DeepSpeed's first release with ZeRO stage 3 (v0.3.13, 2021-03-16)."""


def nearest_multiples(value: int, unit: int) -> list[int]:
    """The multiples of ``unit`` nearest ``value``: the one below (if any) and the one above.

    >>> nearest_multiples(100, 32)
    [96, 128]
    """
    below = value // unit * unit
    above = below + unit
    return [m for m in (below, above) if m > 0 and m != value] or [unit]


_UNION_TAGS = ("literal['auto']", "ParallelismSpec")


def _describe(exc: ValidationError) -> str:
    """The most specific pydantic error as ``field.path: message``."""

    def clean(loc: tuple[Any, ...]) -> list[str]:
        return [str(p) for p in loc if str(p) not in _UNION_TAGS and "function-" not in str(p)]

    errors = exc.errors()
    err = max(errors, key=lambda e: (len(clean(e["loc"])), -errors.index(e)))
    path = ".".join(clean(err["loc"]))
    msg = err["msg"].removeprefix("Value error, ")
    if msg.startswith(f"{path}: "):
        msg = msg[len(path) + 2 :]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] in ("literal_error", "enum"):
        msg = f"{msg}, got {err.get('input')!r}"
    if path == "parallelism" and err["type"] == "literal_error":
        msg += " (or a mapping {sharding, tp, pp})"
    if not path and re.match(r"^[a-z_][a-z_.]*: ", msg):
        return msg  # a model-level check that names its own field
    return f"{path or 'spec'}: {msg}"


def _parse_scalar(text: str, key: str) -> Any:
    from gpuplan.errors import GpuPlanError

    try:
        return parse_yaml(text, what=f"--set {key}", path=None, error=SpecError)
    except GpuPlanError as exc:
        if "malformed YAML" in exc.message:
            return text
        raise


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set a.b=value`` overrides (value parsed as YAML) to raw spec data.

    >>> apply_overrides({"precision": "fp32"}, ["precision=bf16-mixed", "lora.rank=8"])
    {'precision': 'bf16-mixed', 'lora': {'rank': 8}}
    """
    out: dict[str, Any] = dict(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(
                f"--set: expected FIELD=VALUE, got {item!r}", hint="--set precision=bf16-mixed"
            )
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.get(part)
            child = dict(child) if isinstance(child, dict) else {}
            node[part] = child
            node = child
        node[parts[-1]] = _parse_scalar(raw, key.strip())
    return out


def parse_spec(data: Any, *, origin: str = "spec", base_dir: Path | None = None) -> JobSpec:
    """Validate raw spec data; errors become one-line SpecErrors naming the field."""
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: expected a mapping of spec fields, got {type(data).__name__}")
    model = data.get("model")
    if isinstance(model, str) and base_dir is not None and model.endswith(".json"):
        path = Path(model)
        if not path.is_absolute() and path_kind(base_dir / path) is not None:
            data = {**data, "model": str(base_dir / path)}
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{origin}: {_describe(exc)}", hint="see `gpuplan spec schema`") from exc


def spec_from_text(
    text: str,
    overrides: list[str] | None = None,
    *,
    origin: str = "spec",
    base_dir: Path | None = None,
) -> JobSpec:
    """Parse job-spec text (YAML or JSON) and apply ``--set`` overrides.

    The web API's parser for request bodies; it reads through
    :func:`gpuplan.userfile.parse_yaml`, so a body is refused (alias bombs, deep
    nesting, duplicate keys) exactly as :func:`load_spec` refuses a file.
    """

    data = parse_yaml(text, what=origin, path=None, error=SpecError)
    if data is None:
        data = {}
    return _spec_from_data(data, overrides, origin=origin, base_dir=base_dir)


def load_spec(path: Path, overrides: list[str] | None = None) -> JobSpec:
    """Read a job spec file (YAML or JSON) and apply ``--set`` overrides."""

    data = read_yaml(path, what="spec", error=SpecError)
    return _spec_from_data(data, overrides, origin=str(path), base_dir=path.parent)


def _spec_from_data(
    data: Any, overrides: list[str] | None, *, origin: str, base_dir: Path | None
) -> JobSpec:
    if isinstance(data, dict) and overrides:
        data = apply_overrides(data, overrides)
    return parse_spec(data, origin=origin, base_dir=base_dir)


def spec_json_schema() -> dict[str, Any]:
    """The JSON schema of the job spec (``gpuplan spec schema``)."""
    return JobSpec.model_json_schema()
