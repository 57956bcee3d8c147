"""Vision models: the ResNet layer graph and per-layer parameters, sizes and MACs.

:func:`resnet_layers` expands a ResNet description (Hugging Face ``ResNetConfig``
fields, which match torchvision's ``ResNet(block, layers)``) into an explicit
:class:`CnnLayer` graph. :func:`layer_stats` walks a CNN graph or a ViT for a
given image size and returns, per node, its parameters, output elements per
image and forward multiply-accumulates (MACs), from which an estimator derives
activation bytes and FLOPs.

FLOP convention: ``forward_flops = 2 x MACs`` of convolutions, linear layers
and attention matmuls, as torchvision's ``_ops`` ("GFLOPS") figures and fvcore
count them; element-wise work (norms, activations, adds, pooling) is listed with
its output size but 0 MACs. Checked against torchvision: ResNet-50 4.089 G and
ViT-B/16 17.564 G MACs at 224 x 224.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuplan.errors import SpecError
from gpuplan.models.config import CnnLayer, ModelConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerStats:
    """One node's size and work for one input image.

    Attributes:
        name: node name (``layer1.0.conv1``, ``encoder.3.mlp.fc1``).
        kind: operation (``conv``, ``batchnorm``, ``linear``, ``matmul``, ``layernorm``...).
        params: parameters owned by the node.
        output_shape: output tensor shape per image: (C, H, W) for CNN nodes,
            (tokens, width) or (heads, tokens, tokens) for ViT nodes.
        output_elements_per_image: product of ``output_shape``.
        forward_macs_per_image: multiply-accumulates of the forward pass.
        forward_flops_per_image: ``2 * forward_macs_per_image``.
    """

    name: str
    kind: str
    params: int
    output_shape: tuple[int, ...]
    output_elements_per_image: int
    forward_macs_per_image: int
    forward_flops_per_image: int


def _stats(name: str, kind: str, params: int, shape: tuple[int, ...], macs: int) -> LayerStats:
    elements = 1
    for dim in shape:
        elements *= dim
    return LayerStats(
        name=name,
        kind=kind,
        params=params,
        output_shape=shape,
        output_elements_per_image=elements,
        forward_macs_per_image=macs,
        forward_flops_per_image=2 * macs,
    )


def _conv_bn_relu(
    prefix: str, idx: int, c_in: int, c_out: int, k: int, stride: int, *, relu: bool
) -> list[CnnLayer]:
    layers = [
        CnnLayer(
            name=f"{prefix}conv{idx}",
            kind="conv",
            in_channels=c_in,
            out_channels=c_out,
            kernel_size=k,
            stride=stride,
            padding=k // 2,
        ),
        CnnLayer(name=f"{prefix}bn{idx}", kind="batchnorm", in_channels=c_out, out_channels=c_out),
    ]
    if relu:
        layers.append(
            CnnLayer(name=f"{prefix}relu{idx}", kind="relu", in_channels=c_out, out_channels=c_out)
        )
    return layers


def _block(
    prefix: str, c_in: int, c_out: int, stride: int, *, bottleneck: bool, stride_in_1x1: bool
) -> list[CnnLayer]:
    """One residual block: main path, optional projection shortcut, add, ReLU."""
    entry = f"{prefix}input"
    if bottleneck:
        mid = c_out // 4  # HF ResNetBottleNeckLayer reduction=4; torchvision expansion=4
        s1, s2 = (stride, 1) if stride_in_1x1 else (1, stride)
        main = (
            _conv_bn_relu(prefix, 1, c_in, mid, 1, s1, relu=True)
            + _conv_bn_relu(prefix, 2, mid, mid, 3, s2, relu=True)
            + _conv_bn_relu(prefix, 3, mid, c_out, 1, 1, relu=False)
        )
    else:
        main = _conv_bn_relu(prefix, 1, c_in, c_out, 3, stride, relu=True) + _conv_bn_relu(
            prefix, 2, c_out, c_out, 3, 1, relu=False
        )
    main[0] = main[0].model_copy(update={"inputs": (entry,)})
    shortcut_out = entry
    shortcut: list[CnnLayer] = []
    if c_in != c_out or stride != 1:
        shortcut = [
            CnnLayer(
                name=f"{prefix}downsample.0",
                kind="conv",
                inputs=(entry,),
                in_channels=c_in,
                out_channels=c_out,
                stride=stride,
            ),
            CnnLayer(
                name=f"{prefix}downsample.1",
                kind="batchnorm",
                in_channels=c_out,
                out_channels=c_out,
            ),
        ]
        shortcut_out = f"{prefix}downsample.1"
    tail = [
        CnnLayer(
            name=f"{prefix}add",
            kind="add",
            inputs=(main[-1].name, shortcut_out),
            in_channels=c_out,
            out_channels=c_out,
        ),
        CnnLayer(name=f"{prefix}relu", kind="relu", in_channels=c_out, out_channels=c_out),
    ]
    return main + shortcut + tail


def resnet_layers(
    *,
    num_channels: int,
    embedding_size: int,
    hidden_sizes: Sequence[int],
    depths: Sequence[int],
    layer_type: str,
    num_classes: int,
    downsample_in_first_stage: bool = False,
    downsample_in_bottleneck: bool = False,
) -> tuple[tuple[CnnLayer, ...], int]:
    """Expand a ResNet description into its layer graph.

    The arguments are Hugging Face ``ResNetConfig`` fields; with the defaults they
    build torchvision's ResNet v1.5 (stride on the 3x3 convolution), e.g.
    ``hidden_sizes=[256, 512, 1024, 2048], depths=[3, 4, 6, 3]`` is ``resnet50``.
    A block's input is referred to as ``<block>.input``, which names the previous
    node's output.

    Args:
        num_channels: input image channels.
        embedding_size: channels of the 7x7 stem convolution.
        hidden_sizes: output channels of each stage.
        depths: blocks per stage.
        layer_type: ``bottleneck`` or ``basic``.
        num_classes: classifier outputs (0 for none).
        downsample_in_first_stage: stride 2 in the first stage too.
        downsample_in_bottleneck: stride on the first 1x1 (ResNet v1) instead of the 3x3.

    Returns:
        The nodes in execution order, and the number of weighted layers on the
        main path (convolutions and the classifier; 50 for ResNet-50).

    Raises:
        SpecError: unknown ``layer_type`` or mismatched list lengths.
    """
    if layer_type not in ("bottleneck", "basic"):
        raise SpecError(
            f"layer_type: unknown ResNet block {layer_type!r}; allowed: bottleneck, basic"
        )
    if len(hidden_sizes) != len(depths) or not depths:
        raise SpecError("hidden_sizes and depths must be non-empty lists of the same length")
    bottleneck = layer_type == "bottleneck"
    layers = _conv_bn_relu("", 1, num_channels, embedding_size, 7, 2, relu=True)
    layers.append(
        CnnLayer(
            name="maxpool",
            kind="maxpool",
            in_channels=embedding_size,
            out_channels=embedding_size,
            kernel_size=3,
            stride=2,
            padding=1,
        )
    )
    c_in = embedding_size
    for stage, (c_out, depth) in enumerate(zip(hidden_sizes, depths, strict=True)):
        first_stride = 2 if stage > 0 or downsample_in_first_stage else 1
        for index in range(depth):
            prefix = f"layer{stage + 1}.{index}."
            stride = first_stride if index == 0 else 1
            block = _block(
                prefix,
                c_in,
                c_out,
                stride,
                bottleneck=bottleneck,
                stride_in_1x1=downsample_in_bottleneck,
            )
            # resolve "<block>.input" to the node before the block
            entry, placeholder = layers[-1].name, f"{prefix}input"
            for layer in block:
                inputs = tuple(entry if i == placeholder else i for i in layer.inputs)
                layers.append(layer.model_copy(update={"inputs": inputs}))
            c_in = c_out
    layers.append(
        CnnLayer(name="avgpool", kind="global_avgpool", in_channels=c_in, out_channels=c_in)
    )
    weighted = 1 + sum(depths) * (3 if bottleneck else 2)
    if num_classes:
        layers.append(
            CnnLayer(
                name="fc", kind="linear", in_channels=c_in, out_channels=num_classes, bias=True
            )
        )
        weighted += 1
    return tuple(layers), weighted


def _cnn_stats(cfg: ModelConfig, image_size: int) -> tuple[LayerStats, ...]:
    shapes: dict[str, tuple[int, int, int]] = {}
    previous = (cfg.num_channels, image_size, image_size)
    out: list[LayerStats] = []
    for layer in cfg.cnn_layers:
        sources = [shapes[name] for name in layer.inputs] if layer.inputs else [previous]
        c, h, w = sources[0]
        if c != layer.in_channels:
            raise SpecError(
                f"cnn_layers: {layer.name} expects {layer.in_channels} channels, gets {c}"
            )
        params = macs = 0
        bias = layer.out_channels if layer.bias else 0
        if layer.kind in ("conv", "maxpool"):
            h = (h + 2 * layer.padding - layer.kernel_size) // layer.stride + 1
            w = (w + 2 * layer.padding - layer.kernel_size) // layer.stride + 1
            if h <= 0 or w <= 0:
                raise SpecError(f"image_size: {image_size} px is too small for {layer.name}")
        if layer.kind == "conv":
            per_output = layer.in_channels // layer.groups * layer.kernel_size**2
            params = per_output * layer.out_channels + bias
            macs = per_output * layer.out_channels * h * w
        elif layer.kind == "batchnorm":
            params = 2 * layer.out_channels
        elif layer.kind == "global_avgpool":
            h = w = 1
        elif layer.kind == "linear":
            features = c * h * w
            params = features * layer.out_channels + bias
            macs = features * layer.out_channels
            h = w = 1
        shape = (layer.out_channels, h, w)
        shapes[layer.name] = previous = shape
        out.append(_stats(layer.name, layer.kind, params, shape, macs))
    return tuple(out)


def _vit_stats(cfg: ModelConfig, image_size: int) -> tuple[LayerStats, ...]:
    if image_size % cfg.patch_size:
        raise SpecError(
            f"image_size: {image_size} px is not a multiple of the patch size {cfg.patch_size}"
        )
    h, inter = cfg.hidden_size, cfg.intermediate_size
    heads, q_width = cfg.num_attention_heads, cfg.num_attention_heads * cfg.head_dim
    patches = (image_size // cfg.patch_size) ** 2
    n = patches + 1
    norm = 2 * h if cfg.norm_bias else h
    qkv_params = 3 * h * q_width + (3 * q_width if cfg.qkv_bias else 0)
    out_params = q_width * h + (h if cfg.attention_out_bias else 0)
    fc1_params = h * inter + (inter if cfg.mlp_bias else 0)
    fc2_params = inter * h + (h if cfg.mlp_bias else 0)
    patch_in = cfg.num_channels * cfg.patch_size**2
    out = [
        _stats("conv_proj", "conv", patch_in * h + h, (patches, h), patches * h * patch_in),
        _stats("embeddings", "add", h + cfg.position_embedding_rows * h, (n, h), 0),
    ]
    for i in range(cfg.num_layers):
        p = f"encoder.{i}."
        attn_macs = heads * n * n * cfg.head_dim
        out += [
            _stats(p + "ln_1", cfg.norm, norm, (n, h), 0),
            _stats(p + "attn.qkv", "linear", qkv_params, (n, 3 * q_width), n * h * 3 * q_width),
            _stats(p + "attn.scores", "matmul", 0, (heads, n, n), attn_macs),
            _stats(p + "attn.softmax", "softmax", 0, (heads, n, n), 0),
            _stats(p + "attn.context", "matmul", 0, (n, q_width), attn_macs),
            _stats(p + "attn.out_proj", "linear", out_params, (n, h), n * q_width * h),
            _stats(p + "add_1", "add", 0, (n, h), 0),
            _stats(p + "ln_2", cfg.norm, norm, (n, h), 0),
            _stats(p + "mlp.fc1", "linear", fc1_params, (n, inter), n * h * inter),
            _stats(p + "mlp.act", cfg.activation, 0, (n, inter), 0),
            _stats(p + "mlp.fc2", "linear", fc2_params, (n, h), n * inter * h),
            _stats(p + "add_2", "add", 0, (n, h), 0),
        ]
    out.append(_stats("ln", cfg.norm, norm if cfg.final_norm else 0, (n, h), 0))
    if cfg.num_classes:
        classes = cfg.num_classes
        out.append(_stats("head", "linear", h * classes + classes, (classes,), h * classes))
    return tuple(out)


def layer_stats(cfg: ModelConfig, *, image_size: int | None = None) -> tuple[LayerStats, ...]:
    """Per-node parameters, output elements and forward MACs for one image.

    Args:
        cfg: a ``cnn`` or ``vit`` model.
        image_size: input side in pixels; defaults to ``cfg.image_size``. A ViT's
            position table keeps its configured size (it is interpolated at run
            time), so parameters do not change with the image size.

    Returns:
        One :class:`LayerStats` per node, in execution order; their ``params``
        sum to :func:`~gpuplan.models.params.count_parameters` ``.total``.

    Raises:
        SpecError: ``cfg`` is not a vision model, or the image size does not fit it.
    """
    if not cfg.is_vision:
        raise SpecError(
            f"model: {cfg.id} is a {cfg.family} text model; per-image layer stats need a cnn or vit"
        )
    size = cfg.image_size if image_size is None else image_size
    if size <= 0:
        raise SpecError(f"image_size: must be a positive number of pixels, got {size}")
    if cfg.family == "cnn":
        return _cnn_stats(cfg, size)
    return _vit_stats(cfg, size)


def forward_macs_per_image(cfg: ModelConfig, *, image_size: int | None = None) -> int:
    """Total forward multiply-accumulates for one image (see :func:`layer_stats`).

    Example:
        >>> from gpuplan.models import load_model
        >>> round(forward_macs_per_image(load_model("resnet-50")) / 1e9, 3)
        4.089
    """
    return sum(s.forward_macs_per_image for s in layer_stats(cfg, image_size=image_size))
