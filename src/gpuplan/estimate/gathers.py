"""Parameter gathers of engines that shard parameters one tensor at a time.

Most ZeRO-3/FSDP engines gather a layer (an FSDP unit, a module) in one collective, which
``speed.estimate_time`` prices from the layer's bytes. DeepSpeed before 0.6.0 gathered every
parameter tensor on its own; this module counts those tensors and prices the gathers.
"""

from __future__ import annotations

from gpuplan.estimate import comm
from gpuplan.estimate.calibration import ArchEfficiency
from gpuplan.estimate.shape import Shape
from gpuplan.estimate.strategy import Strategy


def parameter_tensors(shape: Shape) -> tuple[int, int]:
    """Parameter tensors (weights, biases, norm scales) of one layer, and outside the layers
    (embeddings, final norm, untied head): what a per-parameter engine gathers one by one.
    A CNN has no repeated layer: all its tensors count as outside (a convolution's weight, a
    batch norm's scale and shift, a linear layer's weight and bias)."""
    if shape.family == "cnn":
        per_kind = {"conv": 1, "batchnorm": 2, "linear": 2}
        return 0, sum(per_kind.get(layer.kind, 0) for layer in shape.cnn_layers)
    linear = sum(lin.count * (2 if lin.bias else 1) for lin in shape.linears)
    linear_params = sum(lin.params for lin in shape.linears)
    norms = max(0, shape.params_per_layer - linear_params) // max(1, shape.hidden)
    outside = (
        1
        + (0 if shape.tied_embeddings else 1)
        + max(1, shape.params_final_norm // max(1, shape.hidden))
    )
    return linear + norms, outside


def deepspeed_parameter_gathers(
    shape: Shape,
    st: Strategy,
    layers_stage: int,
    gather_bytes: float,
    intra: comm.Link,
    inter: comm.Link | None,
    dp_per_node: int,
    eff: ArchEfficiency,
) -> tuple[float, int]:
    """Seconds of one micro-batch's ZeRO-3 gathers in DeepSpeed 0.3.13-0.5.x, and the tensor
    count. ``PartitionedParameterCoordinator.fetch_sub_module`` gathers every parameter of a
    module by ``_allgather_param`` (``deepspeed/runtime/zero/partition_parameters.py``):
    ``torch.cuda.synchronize()``, then ``torch.distributed.all_gather`` into a list of one
    partition per rank, which ``ProcessGroupNCCL::allgather`` fills from a flat buffer with
    one copy per rank. So each tensor pays a collective of its own (its ring's latency) and
    one launch per rank, and the synchronize keeps compute from hiding any of it. The
    checkpointed forward fetches again in backward (three fetches, not two)."""
    per_layer, outside = parameter_tensors(shape)
    tensors = per_layer * layers_stage + outside
    shard = st.shard_degree
    fetches = 3 if st.activation_checkpointing == "full" else 2
    one = comm.collective_time(
        "all-gather", gather_bytes / tensors, shard, dp_per_node, intra, inter
    )
    return fetches * tensors * (one + shard * eff.kernel_overhead_s), tensors
