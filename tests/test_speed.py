"""Speed: the time contract, communication tiers, scaling and hardware selection."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpuplan import holdout
from gpuplan.catalog.loader import load_catalog
from gpuplan.errors import GpuPlanError, MissingInputError
from gpuplan.estimate import calibration, comm
from gpuplan.estimate import speed as speed_mod
from gpuplan.estimate.calibration import efficiencies
from gpuplan.estimate.configure import configure, default_topology
from gpuplan.estimate.fit import memory_job, model_shape
from gpuplan.estimate.memory import layout_for
from gpuplan.estimate.speed import TimeEstimate
from gpuplan.estimate.strategy import Strategy
from gpuplan.spec import load_spec, parse_spec

EX = Path(__file__).resolve().parents[1] / "examples"
TIME_KEYS = {
    "step_time_s",
    "samples_per_s",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "compute_s",
    "exposed_comm_s",
    "comm_fraction",
    "scaling_efficiency",
    "time_to_train_s",
    "gpu_hours",
}


@pytest.fixture(scope="module")
def cat():  # type: ignore[no-untyped-def]
    return load_catalog(use_user=False)


def test_estimate_time_contract(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli(
        "estimate",
        str(EX / "llama3-8b-pretrain.yaml"),
        "--gpu",
        "H100-SXM",
        "--count",
        "8",
        "--json",
    )
    assert result.exit_code == 0, result.output
    t = json.loads(result.stdout)["time"]
    assert set(t) >= TIME_KEYS
    assert t["tokens_per_s"] == pytest.approx(t["tokens_per_s_per_gpu"] * 8)
    assert 0 < t["mfu"] < 1
    assert t["gpu_hours"] == pytest.approx(t["time_to_train_s"] * 8 / 3600)
    # 100B tokens at the reported throughput
    assert t["time_to_train_s"] == pytest.approx(1e11 / t["tokens_per_s"], rel=1e-6)


def test_vision_tokens_are_null(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli(
        "estimate",
        str(EX / "resnet50-imagenet.yaml"),
        "--gpu",
        "A100-80GB",
        "--count",
        "8",
        "--json",
    )
    t = json.loads(result.stdout)["time"]
    assert t["tokens_per_s"] is None
    assert t["tokens_per_s_per_gpu"] is None
    assert t["samples_per_s"] > 0


def test_collective_formulas() -> None:
    link = comm.Link(bandwidth=100e9, latency=0.0, name="x")
    nbytes = 1e9
    # nccl-tests: all-reduce moves 2(n-1)/n x S per rank, all-gather (n-1)/n x S
    assert comm.collective_time("all-reduce", nbytes, 8, 8, link, None) == pytest.approx(
        2 * 7 / 8 * 1e9 / 100e9
    )
    assert comm.collective_time("all-gather", nbytes, 8, 8, link, None) == pytest.approx(
        7 / 8 * 1e9 / 100e9
    )
    assert comm.collective_time("all-reduce", nbytes, 1, 1, link, None) == 0.0


def test_pcie_loses_to_nvswitch_and_slow_network_to_fast(cat) -> None:  # type: ignore[no-untyped-def]
    spec = parse_spec(
        {
            "model": "llama-2-7b",
            "precision": "bf16-mixed",
            "seq_len": 2048,
            "micro_batch_size": 1,
            "global_batch_size": 64,
            "parallelism": {"sharding": "zero2"},
            "work": {"tokens": 10**9},
        }
    )
    gpu = cat.gpu("A100-80GB")
    nvs = configure(spec, gpu, 8, default_topology(gpu, 8, intra_node="nvswitch"))
    pcie = configure(spec, gpu, 8, default_topology(gpu, 8, intra_node="pcie"))
    assert pcie.time.comm_total_s > nvs.time.comm_total_s
    assert pcie.time.step_time_s >= nvs.time.step_time_s
    fast = configure(
        spec, gpu, 16, default_topology(gpu, 16, inter_node_gbps=1600, fabric="infiniband")
    )
    slow = configure(
        spec, gpu, 16, default_topology(gpu, 16, inter_node_gbps=25, fabric="ethernet")
    )
    assert slow.time.step_time_s > fast.time.step_time_s
    assert slow.time.scaling_efficiency < fast.time.scaling_efficiency


def test_multi_node_needs_the_network(cat) -> None:  # type: ignore[no-untyped-def]
    spec = load_spec(EX / "llama3-8b-pretrain.yaml")
    with pytest.raises(MissingInputError, match="--inter-node-gbps"):
        configure(spec, cat.gpu("H100-SXM"), 16)


def test_pipeline_bubble(cat) -> None:  # type: ignore[no-untyped-def]
    spec = parse_spec(
        {
            "model": "llama-2-13b",
            "precision": "bf16-mixed",
            "seq_len": 2048,
            "micro_batch_size": 1,
            "global_batch_size": 8,
            "parallelism": {"sharding": "none", "tp": 1, "pp": 4},
            "work": {"steps": 10},
        }
    )
    gpu = cat.gpu("H100-SXM")
    conf = configure(spec, gpu, 8, default_topology(gpu, 8), require_fit=False)
    t = conf.time
    m, p = conf.strategy.grad_accum, 4
    assert t.bubble_s == pytest.approx(t.compute_s * (p - 1) / m, rel=1e-6)


def test_efficiency_data_has_a_basis() -> None:
    effs = efficiencies()
    for arch in ("Hopper", "Ampere", "Blackwell", "Ada Lovelace", "Volta", "Turing", "CDNA3"):
        a = effs.archs[arch]
        assert 0 < a.gemm < 1
        assert 0 < a.hbm <= 1
        assert a.basis


def test_scale_table(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli(
        "scale", str(EX / "llama3-8b-lora.yaml"), "--gpu", "A100-80GB", "--max-gpus", "16", "--json"
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    nvswitch = [
        r for r in rows if "nvswitch" in r["interconnect"] or r["interconnect"] == "single GPU"
    ]
    assert [r["gpus"] for r in nvswitch[:5]] == [1, 2, 4, 8, 16]
    assert nvswitch[0]["scaling_efficiency"] == pytest.approx(1.0)


def test_offering_hardware(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli(
        "estimate",
        str(EX / "llama3-8b-lora.yaml"),
        "--offering",
        "aws:p4d.24xlarge",
        "--nodes",
        "2",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["gpu"] == "A100-40GB"
    assert data["count"] == 16
    assert data["topology"]["gpus_per_node"] == 8


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--gpu", "H100-SXM", "--count", "8", "--fabric", "carrier-pigeon"], "--fabric"),
        (["--gpu", "H100-SXM", "--count", "16"], "--inter-node-gbps"),
        (["--offering", "aws"], "--offering"),
        (["--gpu", "A100-80GB", "--set", "precision=fp8-mixed"], "precision"),
    ],
)
def test_estimate_bad_input(cli, args, needle) -> None:  # type: ignore[no-untyped-def]
    result = cli("estimate", str(EX / "llama3-8b-pretrain.yaml"), *args)
    assert result.exit_code == 2
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1
    assert needle in lines[0]


def test_gpu_plan_error_is_the_base(cat) -> None:  # type: ignore[no-untyped-def]
    spec = parse_spec({"model": "llama-3-70b", "seq_len": 4096, "work": {"tokens": 10}})
    with pytest.raises(GpuPlanError):
        configure(spec, cat.gpu("T4"), 1)


def _long_seq_spec(**kw: object):  # type: ignore[no-untyped-def]
    base: dict[str, object] = {
        "model": "llama-3-8b",
        "seq_len": 32768,
        "precision": "bf16-mixed",
        "micro_batch_size": 1,
        "activation_checkpointing": "full",
        "parallelism": {"sharding": "fsdp"},
        "work": {"steps": 10},
    }
    base.update(kw)
    return parse_spec(base)


def test_attention_stays_16_bit_under_fp8(cat) -> None:  # type: ignore[no-untyped-def]
    """fp8 recipes convert the transformer's linear layers only: attention and the LM head do not
    speed up with the fp8 peak."""
    gpu = cat.gpu("H100-SXM")
    topo = default_topology(gpu, 8)
    bf16 = configure(_long_seq_spec(), gpu, 8, topo, require_fit=False).time
    fp8 = configure(_long_seq_spec(precision="fp8-mixed"), gpu, 8, topo, require_fit=False).time
    assert fp8.parts["attention"] == pytest.approx(bf16.parts["attention"], rel=1e-9)
    assert fp8.parts["lm head + loss"] == pytest.approx(bf16.parts["lm head + loss"], rel=1e-9)
    assert fp8.parts["gemm"] < bf16.parts["gemm"]


def test_cudnn_attention_is_faster_on_hopper(cat) -> None:  # type: ignore[no-untyped-def]
    gpu = cat.gpu("H100-SXM")
    topo = default_topology(gpu, 8)
    flash = configure(_long_seq_spec(attention="fused"), gpu, 8, topo, require_fit=False)
    cudnn = configure(_long_seq_spec(attention="cudnn"), gpu, 8, topo, require_fit=False)
    assert cudnn.time.parts["attention"] < flash.time.parts["attention"]
    assert cudnn.fit.memory.peak_allocated_bytes == flash.fit.memory.peak_allocated_bytes


def test_op_selective_recompute_costs_less_than_full(cat) -> None:  # type: ignore[no-untyped-def]
    gpu = cat.gpu("H100-SXM")
    topo = default_topology(gpu, 8)
    step = {
        mode: configure(
            _long_seq_spec(seq_len=4096, activation_checkpointing=mode),
            gpu,
            8,
            topo,
            require_fit=False,
        ).time.compute_s
        for mode in ("none", "selective-op", "full")
    }
    assert step["none"] < step["selective-op"] < step["full"]


def test_step_parts_add_up_to_the_step_with_tensor_parallel(cat) -> None:  # type: ignore[no-untyped-def]
    """The breakdown shows exposed TP time only, so its parts sum to the step time."""
    spec = parse_spec(
        {
            "model": "llama-2-70b",
            "seq_len": 4096,
            "precision": "bf16-mixed",
            "global_batch_size": 64,
            "activation_checkpointing": "full",
            "parallelism": {"sharding": "zero1", "tp": 8, "pp": 4},
            "work": {"steps": 10},
        }
    )
    gpu = cat.gpu("H100-SXM")
    topo = default_topology(gpu, 64, inter_node_gbps=3200, fabric="infiniband")
    t = configure(spec, gpu, 64, topo, require_fit=False).time
    assert t.parts["tp comm exposed"] > 0
    assert sum(t.parts.values()) == pytest.approx(t.step_time_s, rel=1e-9)


@pytest.mark.parametrize(("checkpointing", "reductions"), [("none", 4), ("full", 6)])
def test_tensor_parallel_reductions_are_megatrons(  # type: ignore[no-untyped-def]
    cat, checkpointing: str, reductions: int
) -> None:
    """Per layer and micro-batch, Megatron reduces the hidden state twice in forward and twice
    in backward (``megatron/core/tensor_parallel/mappings.py``); full checkpointing runs the
    forward's two again."""
    spec = parse_spec(
        {
            "model": "llama-2-70b",
            "seq_len": 4096,
            "precision": "bf16-mixed",
            "global_batch_size": 8,
            "activation_checkpointing": checkpointing,
            "parallelism": {"sharding": "zero1", "tp": 8},
        }
    )
    gpu = cat.gpu("H100-SXM")
    topo = default_topology(gpu, 8)
    conf = configure(spec, gpu, 8, topo, require_fit=False)
    st = conf.strategy
    assert st.tp == 8 and st.micro_batch_size == 1
    eff = efficiencies()
    link = comm.intra_link(gpu, topo, eff)
    one = comm.collective_time("all-reduce", 4096 * 8192 * 2, 8, 8, link, None)
    exposed = 1 - eff.overlap["tensor_parallel"]
    expected = st.grad_accum * 80 * reductions * one * exposed
    assert conf.time.parts["tp comm exposed"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    ("gpu_id", "cudnn"), [("H100-SXM", True), ("B200", True), ("A100-80GB", False), ("L40S", False)]
)
def test_auto_attention_follows_pytorch_sdpa(cat, gpu_id: str, cudnn: bool) -> None:  # type: ignore[no-untyped-def]
    """auto is what current SDPA picks: cuDNN on sm90/sm100, FlashAttention-2 class elsewhere."""
    gpu = cat.gpu(gpu_id)
    topo = default_topology(gpu, 8)
    auto = configure(_long_seq_spec(precision="bf16-mixed"), gpu, 8, topo, require_fit=False)
    kind = "cudnn" if cudnn else "fused"
    pinned = configure(_long_seq_spec(attention=kind), gpu, 8, topo, require_fit=False)
    assert auto.time.parts["attention"] == pytest.approx(pinned.time.parts["attention"], rel=1e-9)
    assert ("cuDNN class" in " ".join(auto.time.assumptions)) is cudnn


def test_efficiency_file_is_strict() -> None:
    """Every parameter is stated in efficiency.yaml; a missing or unknown key is an error."""
    from importlib import resources

    import yaml

    from gpuplan.errors import CatalogError
    from gpuplan.estimate.calibration import parse_efficiency_file

    text = resources.files("gpuplan.estimate").joinpath("efficiency.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    stated = data["architectures"]["Ampere"]["attention_cudnn"]
    assert parse_efficiency_file(data).archs["Ampere"].attention_cudnn == stated
    missing = yaml.safe_load(text)
    del missing["architectures"]["Ampere"]["gemm_fp32"]
    with pytest.raises(CatalogError, match="Ampere.gemm_fp32"):
        parse_efficiency_file(missing)
    unknown = yaml.safe_load(text)
    unknown["overlap"]["fsdp_prefetch"] = 0.5
    with pytest.raises(CatalogError, match="fsdp_prefetch"):
        parse_efficiency_file(unknown)
    for path in ("cnn", "compiled"):  # the code paths' own step overheads
        no_path = yaml.safe_load(text)
        del no_path[path]
        with pytest.raises(CatalogError, match=f"^efficiency.yaml: {path}: "):
            parse_efficiency_file(no_path)
        bad = yaml.safe_load(text)
        bad[path]["step_overhead"] = 1.5
        with pytest.raises(CatalogError, match=f"{path}.step_overhead"):
            parse_efficiency_file(bad)


def test_carried_efficiencies_follow_their_fitted_sources() -> None:
    """The values efficiency.yaml states as carried from a fitted one are equal to it, so a
    re-fit cannot leave them behind (its `basis` texts say which is carried from which)."""
    from gpuplan.estimate import calibration

    a = calibration.efficiencies().archs
    assert a["Ampere"].attention_cudnn == a["Ampere"].attention  # FlashAttention-2 is native
    assert a["Ampere"].gemm_fp8 == a["Ampere"].gemm  # no fp8 on Ampere
    assert a["Ada Lovelace"].gemm_fp8 == a["Ada Lovelace"].gemm  # no fp8 row
    # Ada runs Ampere's kernels: its values and their reference GPU are Ampere's
    ada, ampere = a["Ada Lovelace"], a["Ampere"]
    assert (ada.gemm, ada.attention, ada.attention_cudnn) == (ampere.gemm,) + (
        ampere.attention,
    ) * 2
    assert ada.matmul_reference == ampere.matmul_reference == a["Turing"].matmul_reference
    assert (a["Turing"].gemm, a["Turing"].attention) == (a["Ampere"].gemm, a["Ampere"].attention)
    # the step overhead fitted in place of Ampere's GEMM level goes with it
    assert ada.step_overhead == a["Turing"].step_overhead == ampere.step_overhead
    # Ampere's GEMM level is its reference GPU's measured best matmul, not fitted
    assert ampere.matmul_reference is not None
    assert ampere.gemm == round(ampere.matmul_reference, 2)
    # so is Volta's: the V100-SXM2-16GB's, with a step overhead fitted in its place
    volta = a["Volta"]
    v100 = load_catalog(use_user=False).gpu("V100-16GB")
    assert volta.matmul_reference == pytest.approx(v100.matmul_fraction, abs=0.0005)
    assert volta.gemm == round(volta.matmul_reference, 2) and volta.step_overhead > 0.05
    # Hopper's x the measured B200 / H100 large-GEMM ratio (fit_efficiency BLACKWELL_OVER_HOPPER)
    assert a["Blackwell"].gemm == round(0.88 * a["Hopper"].gemm, 2)
    assert a["Blackwell"].gemm_fp8 == round(0.85 * a["Hopper"].gemm_fp8, 2)
    assert a["Hopper"].attention_cudnn == round(2.0 * a["Hopper"].attention, 2)
    assert a["Blackwell"].attention == round(a["Blackwell"].attention_cudnn / 2.0, 2)


def _resnet50_step(cat, gpu_id: str, precision: str, kernels: str, batch: int) -> TimeEstimate:  # type: ignore[no-untyped-def]
    """One GPU's ResNet-50 training step at 224 px."""
    spec = parse_spec(
        {
            "model": "resnet-50",
            "precision": precision,
            "optimizer": "sgd-momentum",
            "micro_batch_size": batch,
            "image_size": 224,
            "cnn_kernels": kernels,
        }
    )
    gpu = cat.gpu(gpu_id)
    return configure(spec, gpu, 1, default_topology(gpu, 1)).time


def test_cnn_kernels_price_eager_passes_and_nchw_transposes(cat) -> None:  # type: ignore[no-untyped-def]
    """PyTorch's eager ResNet pays separate batch-norm/ReLU/add passes and, in NCHW, cuDNN's
    transposes around tensor-core convolutions; fused NHWC kernels pay neither. The
    convolutions themselves cost the same in all three."""

    def parts(kernels: str, precision: str = "fp16-mixed") -> dict[str, float]:
        t = _resnet50_step(cat, "A100-80GB", precision, kernels, 256)
        return {**t.parts, "step_time_s": t.step_time_s}

    eager, last, fused = parts("eager"), parts("channels-last"), parts("fused")
    assert eager["convolutions"] == pytest.approx(fused["convolutions"], rel=0.01)
    assert "NCHW transposes" in eager and "NCHW transposes" not in last
    # batch norm 8 passes, ReLU 5, add 6 against 4 each when fused: more than 1.5x
    assert last["elementwise"] > 1.5 * fused["elementwise"]
    assert eager["step_time_s"] > last["step_time_s"] > fused["step_time_s"]
    # plain fp32 (no tensor cores) convolutions read NCHW directly
    assert "NCHW transposes" not in parts("eager", "fp32")


def test_plain_fp32_gemms_follow_each_gpus_measured_sgemm(cat) -> None:  # type: ignore[no-untyped-def]
    """A card's measured plain fp32 matmul sets its CUDA-core GEMM level; a card without one
    takes the median of its compute capability's measured cards, which efficiency.yaml states
    and this test holds to the catalog."""
    import statistics
    from collections import defaultdict

    effs = efficiencies()
    rtx4090 = cat.gpu("RTX-4090")
    assert effs.arch(rtx4090).gemm_fp32 == pytest.approx(54.26 / 82.6)
    by_cc: dict[str, list[float]] = defaultdict(list)
    for gpu in cat.gpus:
        if gpu.fp32_matmul_fraction is not None:
            by_cc[gpu.compute_capability].append(gpu.fp32_matmul_fraction)
    table = effs.fp32_gemm_by_compute_capability
    assert set(table) == set(by_cc)
    for cc, fractions in by_cc.items():
        assert table[cc] == pytest.approx(statistics.median(fractions), abs=0.0005), cc
    a10 = effs.arch(cat.gpu("A10"))  # compute capability 8.6, no SGEMM of its own
    assert a10.gemm_fp32 == table["8.6"] and "compute capability 8.6" in a10.basis
    v100_32 = effs.arch(cat.gpu("V100-32GB"))  # no SGEMM of its own: the V100-16GB's
    assert v100_32.gemm_fp32 == table["7.0"] == pytest.approx(14.06 / 15.7, abs=0.0005)


def test_nchw_tf32_convolutions_take_the_faster_of_tensor_and_cuda_cores(cat) -> None:  # type: ignore[no-untyped-def]
    """With cudnn.benchmark, each NCHW tf32 convolution call runs on whichever is faster: the
    tensor-core kernel with its transposes, or the fp32 CUDA-core kernel reading NCHW. On an
    RTX 4090 TF32 is no faster than fp32, so most calls move; on an A100 (TF32 8x fp32) the
    tensor cores keep most of the work. The choice never makes a step slower."""
    from gpuplan.estimate import compute
    from gpuplan.estimate.calibration import for_dtype
    from gpuplan.estimate.shape import shape_of
    from gpuplan.models.presets import load_preset

    shape = shape_of(load_preset("resnet-50"))

    def step(gpu_id: str, alternative: bool) -> compute.ComputeTime:
        gpu = cat.gpu(gpu_id)
        eff = efficiencies().arch(gpu)
        return compute.cnn_step(
            shape,
            128,
            peak=compute.peak_flops(gpu, "tf32"),
            bw=gpu.memory_bandwidth_gb_per_s * 1e9,
            dtype="tf32",
            act_bytes=4,
            eff=eff,
            image_scale=1.0,
            fp32_alternative=(compute.peak_flops(gpu, "fp32"), for_dtype(eff, "fp32"))
            if alternative
            else None,
        )

    for gpu_id in ("RTX-4090", "A100-80GB"):
        tensor_only, chosen = step(gpu_id, False), step(gpu_id, True)
        assert chosen.layer_s <= tensor_only.layer_s
        assert "convolutions on fp32 CUDA cores" not in tensor_only.parts
    rtx = step("RTX-4090", True).parts
    a100 = step("A100-80GB", True).parts
    assert rtx["convolutions on fp32 CUDA cores"] > 2 * rtx["convolutions"]
    assert a100["convolutions"] > a100["convolutions on fp32 CUDA cores"]
    assert rtx["NCHW transposes"] < 0.1 * step("RTX-4090", False).parts["NCHW transposes"]

    def spec_step(precision: str, kernels: str = "eager") -> dict[str, object]:
        t = _resnet50_step(cat, "RTX-4090", precision, kernels, 128)
        return {**t.parts, "assumptions": " ".join(t.assumptions)}

    tf32 = spec_step("tf32")
    assert "convolutions on fp32 CUDA cores" in tf32 and "cudnn.benchmark" in str(tf32)
    # no transposes to save: channels-last and mixed precision stay on the tensor cores
    assert "convolutions on fp32 CUDA cores" not in spec_step("tf32", "channels-last")
    assert "convolutions on fp32 CUDA cores" not in spec_step("fp16-mixed")


def test_cnn_step_takes_the_cnn_overhead_not_its_architectures(cat) -> None:  # type: ignore[no-untyped-def]
    """A CNN step prices its element-wise kernels one by one, so it takes ``cnn.step_overhead``;
    the architecture's (fitted where a transformer's unpriced element-wise work lands) moves
    transformer steps only."""
    gpu = cat.gpu("A100-80GB")
    base = calibration.efficiencies()

    def step(model: str, effs: calibration.Efficiencies) -> tuple[float, float]:
        fields = {"image_size": 224} if model == "resnet-50" else {"seq_len": 1024}
        spec = parse_spec(
            {"model": model, "precision": "bf16-mixed", "micro_batch_size": 8, **fields}
        )
        with calibration.efficiencies_in_use(effs):
            t = configure(spec, gpu, 1, default_topology(gpu, 1)).time
        return t.step_time_s, t.parts["overhead (unmodelled)"]

    more_arch = holdout.efficiencies_with(base, {"Ampere.step_overhead": 0.35})
    more_cnn = holdout.efficiencies_with(base, {"cnn.step_overhead": 0.35})
    cnn_step, cnn_over = step("resnet-50", base)
    assert cnn_over == pytest.approx(cnn_step - cnn_step / (1 + base.cnn["step_overhead"]))
    assert step("resnet-50", more_arch)[0] == pytest.approx(cnn_step)
    assert step("resnet-50", more_cnn)[0] > cnn_step
    gpt_step = step("gpt2", base)[0]
    assert step("gpt2", more_cnn)[0] == pytest.approx(gpt_step)
    assert step("gpt2", more_arch)[0] > gpt_step


def test_compiled_step_takes_at_most_the_compiled_overhead(cat) -> None:  # type: ignore[no-untyped-def]
    """``torch.compile`` fuses the element-wise work an architecture's step overhead stands
    for: a compiled job pays ``compiled.step_overhead`` where that is lower, and never more
    than its architecture's (Hopper's 0.05 prior)."""
    base = calibration.efficiencies()

    def overhead(gpu_id: str, compiled: bool, effs: calibration.Efficiencies) -> float:
        gpu = cat.gpu(gpu_id)
        spec = parse_spec(
            {
                "model": "llama-3.2-1b",
                "precision": "bf16-mixed",
                "micro_batch_size": 2,
                "seq_len": 2048,
                "framework": "torchtune",
                "compile": compiled,
            }
        )
        with calibration.efficiencies_in_use(effs):
            t = configure(spec, gpu, 1, default_topology(gpu, 1)).time
        return t.parts["overhead (unmodelled)"] / (t.step_time_s - t.parts["overhead (unmodelled)"])

    ampere = base.archs["Ampere"].step_overhead
    low = holdout.efficiencies_with(base, {"compiled.step_overhead": 0.01})
    assert overhead("A100-80GB", False, low) == pytest.approx(ampere)
    assert overhead("A100-80GB", True, low) == pytest.approx(0.01)
    high = holdout.efficiencies_with(base, {"compiled.step_overhead": 0.3})
    hopper = base.archs["Hopper"].step_overhead
    assert overhead("H100-SXM", True, high) == pytest.approx(hopper)


def test_eager_attention_scores_cost_their_passes_in_their_dtype(cat) -> None:  # type: ignore[no-untyped-def]
    """Eager attention reads and writes every score 16 times (20 with dropout) in a step;
    autocast keeps the softmax in fp32, a model cast to 16 bits (Apex O2) in fp16, so the
    memory-bound score traffic halves."""
    gpu = cat.gpu("A100-80GB")

    def attention_s(framework: str) -> float:
        spec = parse_spec(
            {
                "model": "bert-large",
                "seq_len": 384,
                "precision": "fp16-mixed",
                "micro_batch_size": 32,
                "attention": "eager",
                "framework": framework,
            }
        )
        conf = configure(spec, gpu, 1, default_topology(gpu, 1))
        # per sample: configure may pick a different micro-batch for each
        return conf.time.parts["attention"] / conf.strategy.micro_batch_size

    amp, apex = attention_s("hf"), attention_s("apex")
    # memory-bound: (20 x 4 + 2) against (20 x 2 + 2) bytes per score
    assert amp / apex == pytest.approx(82 / 42, rel=0.02)


def test_megatron_fuses_scale_mask_and_softmax_where_its_kernel_fits(cat) -> None:  # type: ignore[no-untyped-def]
    """Megatron's eager attention folds the scale into the QK^T GEMM and runs scale, causal mask
    and softmax as one kernel each way (FusedScaleMaskSoftmax): 10 passes over each 16-bit score
    where PyTorch eager makes 16; past its kernel's 4096-token limit it falls back to 16."""
    gpu = cat.gpu("A100-80GB")

    def run(seq: int, framework: str) -> tuple[float, tuple[str, ...]]:
        spec = parse_spec(
            {
                "model": "gpt2",
                "seq_len": seq,
                "precision": "fp16-mixed",
                "micro_batch_size": 4 if seq <= 2048 else 1,
                "activation_checkpointing": "none" if seq <= 2048 else "full",
                "attention": "eager",
                "framework": framework,
                "parallelism": {"sharding": "none", "tp": 1, "pp": 1},
            }
        )
        conf = configure(spec, gpu, 1, default_topology(gpu, 1))
        return conf.time.parts["attention"], conf.time.assumptions

    fused, notes = run(2048, "megatron")
    assert any("10 times a step" in a and "fused scale-mask-softmax" in a for a in notes)
    # Megatron keeps 16-bit scores too, so only the pass count differs from Apex's
    apex, apex_notes = run(2048, "apex")
    assert any("16 times a step" in a for a in apex_notes)
    assert fused < apex
    _, long_notes = run(8192, "megatron")
    assert any("16 times a step" in a for a in long_notes)


def test_eager_scores_are_also_in_the_elementwise_term_and_the_estimate_says_so(cat) -> None:  # type: ignore[no-untyped-def]
    """The element-wise term prices the saved probabilities a second time (docs/accuracy.md,
    "Eager attention's score traffic": removing it raised the LOSO error), so a longer sequence
    grows the element-wise part by the saved scores, and the assumptions say so. With fused
    attention nothing of s^2 is saved and the element-wise part grows only with the tokens."""
    gpu = cat.gpu("A100-80GB")

    def elementwise_per_token(seq: int, attention: str) -> tuple[float, tuple[str, ...]]:
        spec = parse_spec(
            {
                "model": "bert-large",
                "seq_len": seq,
                "precision": "fp16-mixed",
                "micro_batch_size": 8,
                "attention": attention,
                "parallelism": {"sharding": "none", "tp": 1, "pp": 1},
            }
        )
        conf = configure(spec, gpu, 1, default_topology(gpu, 1))
        tokens = conf.strategy.micro_batch_size * seq * conf.strategy.grad_accum
        return conf.time.parts["elementwise"] / tokens, conf.time.assumptions

    short, notes = elementwise_per_token(128, "eager")
    long, _ = elementwise_per_token(512, "eager")
    assert long > 1.5 * short  # the s^2 probabilities and dropout output per token grow with seq
    assert any("also in the element-wise" in a for a in notes)
    fused_short, fused_notes = elementwise_per_token(128, "fused")
    fused_long, _ = elementwise_per_token(512, "fused")
    assert fused_long == pytest.approx(fused_short, rel=0.01)
    assert not any("also in the element-wise" in a for a in fused_notes)


def test_unfused_adamw_pays_its_passes(cat) -> None:  # type: ignore[no-untyped-def]
    """torch's foreach and per-parameter AdamW make 20 element passes where the fused kernel
    makes 7 (torch/optim/adamw.py), so the memory-bound optimizer step costs 20/7 as much."""
    gpu = cat.gpu("A100-80GB")

    def opt_s(impl: str) -> float:
        spec = parse_spec(
            {"model": "gpt2", "seq_len": 1024, "precision": "bf16-mixed", "optimizer_impl": impl}
        )
        return configure(spec, gpu, 1, default_topology(gpu, 1)).time.optimizer_s

    assert opt_s("foreach") / opt_s("fused") == pytest.approx(20 / 7, rel=1e-6)
    # the per-parameter loop streams the same bytes, and pays its launches on the small tensors
    # (estimate/optimizer_step.py, tests/test_optimizer_step.py)
    assert opt_s("for-loop") > opt_s("foreach")


def test_a_short_reduction_reaches_less_of_the_peak(cat) -> None:  # type: ignore[no-untyped-def]
    """Each GEMM pass writes its output after its reduction (compute._gemm_time): at equal
    FLOPs a reduction of K keeps K / (K + peak x e x bytes / (2 x bandwidth x hbm)) of the
    efficiency, 0.96 at K 4096 and 0.82 at K 768 on an H100 in bf16 at e = 0.5."""

    from gpuplan.estimate.compute import _gemm_time, peak_flops

    gpu = cat.gpu("H100-SXM")
    eff = dataclasses.replace(efficiencies().arch(gpu), gemm=0.5, gemm_half_size=0.0)
    peak, bw = peak_flops(gpu, "bf16"), gpu.memory_bandwidth_gb_per_s * 1e9
    m = n = 16384

    def kept(k: int) -> float:
        flops = 2.0 * m * n * k
        ideal = flops / (peak * eff.gemm)
        return ideal / _gemm_time(flops, 0.0, peak, bw, eff, out_bytes=m * n * 2.0)

    assert kept(4096) == pytest.approx(0.96, abs=0.01)
    assert kept(768) == pytest.approx(0.82, abs=0.01)
    assert kept(768) < kept(4096) < kept(16384) < 1.0


def _zero3(version: str | None, gpus: int, sharding: str = "zero3"):  # type: ignore[no-untyped-def]
    """GPT-2 XL with ZeRO-3 on A100 nodes over 8 x 200 Gb/s, the global batch fixed at 256
    and the micro-batch shrinking as the GPUs grow (as the SC21 paper's ZeRO-3 runs)."""
    spec: dict[str, object] = {
        "model": "gpt2-xl",
        "seq_len": 1024,
        "precision": "fp16-mixed",
        "micro_batch_size": 256 // gpus,
        "global_batch_size": 256,
        "activation_checkpointing": "full",
        "framework": "deepspeed",
        "parallelism": {"sharding": sharding, "tp": 1, "pp": 1},
        "work": {"steps": 10},
    }
    if version is not None:
        spec["deepspeed"] = {"version": version}
    gpu = load_catalog(use_user=False).gpu("A100-80GB")
    topo = default_topology(gpu, gpus, inter_node_gbps=1600, fabric="infiniband")
    return configure(parse_spec(spec), gpu, gpus, topo, require_fit=False).time


def test_deepspeed_before_0_6_gathers_zero3_parameters_one_by_one() -> None:
    """DeepSpeed 0.3.13-0.5.x fetches each ZeRO-3 parameter with its own all-gather after a
    device synchronize, and copies one partition per rank out of it: that time is exposed
    and grows with the ranks, so at a fixed global batch the step stops shrinking (the SC21
    paper's ZeRO-3 rows: the same 67 s a step on 768 and 1,536 GPUs). 0.6.0 and later, and
    ZeRO-1, keep today's model."""
    from gpuplan.estimate.fit import model_shape
    from gpuplan.estimate.gathers import parameter_tensors

    per_layer, outside = parameter_tensors(model_shape("gpt2-xl"))
    assert (per_layer, outside) == (12, 3)  # 4 linears and 2 layer norms, weight and bias each
    assert parameter_tensors(model_shape("llama-3-8b")) == (9, 3)  # 7 linears, 2 RMSNorm scales
    assert parameter_tensors(model_shape("resnet-50")) == (0, 53 + 2 * 53 + 2)
    old, new = _zero3("0.3.13", 64), _zero3(None, 64)
    assert _zero3("0.6.0", 64).step_time_s == pytest.approx(new.step_time_s)
    assert old.parts["dp comm exposed"] > 5 * new.parts["dp comm exposed"]
    assert any("gathers each of" in a for a in old.assumptions)
    # the per-parameter gathers are ZeRO-3's: ZeRO-1 is the same before and after 0.6.0
    assert _zero3("0.3.13", 64, "zero1").step_time_s == pytest.approx(
        _zero3("0.12.0", 64, "zero1").step_time_s
    )
    # twice the GPUs: the new model's step halves, the old one's gathers grow with the ranks
    assert _zero3(None, 128).step_time_s < 0.6 * new.step_time_s
    assert old.parts["dp comm exposed"] < _zero3("0.3.13", 128).parts["dp comm exposed"]


def _ds_dp(sharding: str, **deepspeed: object):  # type: ignore[no-untyped-def]
    """GPT-2 large under DeepSpeed on 16 V100s over NVSwitch (DeepSpeedExamples' autotuning
    node), fp16, micro-batch 2 of 1024 tokens."""
    spec: dict[str, object] = {
        "model": "gpt2-large",
        "seq_len": 1024,
        "precision": "fp16-mixed",
        "micro_batch_size": 2,
        "global_batch_size": 32,
        "framework": "deepspeed",
        "parallelism": {"sharding": sharding, "tp": 1, "pp": 1},
    }
    if deepspeed:
        spec["deepspeed"] = deepspeed
    gpu = load_catalog(use_user=False).gpu("V100-32GB")
    topo = default_topology(gpu, 16, gpus_per_node=16, intra_node="nvswitch")
    return configure(parse_spec(spec), gpu, 16, topo, require_fit=False).time


def test_deepspeed_hides_the_gradient_reduction_only_with_overlap_comm() -> None:
    """DeepSpeed's overlap_comm is on by default for ZeRO-3 only: stage 0 and stage 1 reduce
    after backward and stage 2 on the compute stream, so the whole reduction is exposed; the
    parameters' all-gather runs inside the optimizer step under stages 1 and 2, exposed too.
    Before 0.13.0 stage 1 ignores overlap_comm and all-reduces its buckets."""
    from gpuplan.estimate.frameworks import deepspeed_reduction

    old = (0, 5, 7)
    assert deepspeed_reduction("none", True, None).overlapped is False
    assert deepspeed_reduction("zero1", True, old).collective == "all-reduce"
    assert deepspeed_reduction("zero1", True, old).overlapped is False
    assert deepspeed_reduction("zero1", True, (0, 13, 0)).overlapped is True
    assert deepspeed_reduction("zero1", None, (0, 13, 0)).collective == "reduce-scatter"
    assert deepspeed_reduction("zero2", None, None).overlapped is False
    assert deepspeed_reduction("zero2", True, old).overlapped is True

    for sharding in ("none", "zero1", "zero2"):
        t = _ds_dp(sharding)
        assert t.parts["dp comm exposed"] == pytest.approx(t.comm_total_s, rel=1e-9), sharding
    on = _ds_dp("zero2", overlap_comm=True)
    assert on.parts["dp comm exposed"] < _ds_dp("zero2").parts["dp comm exposed"]
    assert any("overlap_comm" in a for a in _ds_dp("zero2").assumptions)
    # ZeRO-3 hides its reduce-scatters by default; stated off, they are exposed on top of the
    # gathers' (before 0.6.0's per-parameter gathers too)
    z3 = _ds_dp("zero3")
    z3_off = _ds_dp("zero3", overlap_comm=False)
    assert z3_off.comm_total_s == pytest.approx(z3.comm_total_s)
    assert z3_off.parts["dp comm exposed"] > z3.parts["dp comm exposed"]
    assert any("overlap_comm off" in a for a in z3_off.assumptions)
    old_gathers = _ds_dp("zero3", version="0.5.7")
    old_off = _ds_dp("zero3", version="0.5.7", overlap_comm=False)
    assert old_off.parts["dp comm exposed"] > old_gathers.parts["dp comm exposed"]
    # ZeRO-1 before 0.13.0: an all-reduce of the gradients, then the parameters' all-gather
    assert _ds_dp("zero1", version="0.5.7").comm_total_s > _ds_dp("zero1").comm_total_s
    assert _ds_dp("zero1", version="0.5.7", overlap_comm=True).parts[
        "dp comm exposed"
    ] == pytest.approx(_ds_dp("zero1", version="0.5.7").parts["dp comm exposed"])


def _bert_dp(**parallelism: object):  # type: ignore[no-untyped-def]
    """BERT-large fp16 on 8 H100 PCIe cards, data parallel (NVIDIA's MLPerf BERT layout)."""
    spec = {
        "model": "bert-large",
        "seq_len": 256,
        "precision": "fp16-mixed",
        "micro_batch_size": 96,
        "global_batch_size": 768,
        "parallelism": {"sharding": "none", "tp": 1, "pp": 1, **parallelism},
    }
    gpu = load_catalog(use_user=False).gpu("H100-PCIE")
    topo = default_topology(gpu, 8)
    return configure(parse_spec(spec), gpu, 8, topo, require_fit=False).time


def test_a_reduction_after_backward_is_exposed_whole() -> None:
    """parallelism.overlap_grad_reduce false (Apex DistributedFusedLAMB without
    overlap_reductions, as NVIDIA's MLPerf BERT logs print it; Megatron-LM's default): the
    whole reduction waits after backward. Unset, most of it hides behind backward."""
    hidden, after = _bert_dp(), _bert_dp(overlap_grad_reduce=False)
    assert after.comm_total_s == pytest.approx(hidden.comm_total_s)
    assert after.parts["dp comm exposed"] == pytest.approx(after.comm_total_s, rel=1e-9)
    assert hidden.parts["dp comm exposed"] < 0.5 * hidden.comm_total_s
    assert after.step_time_s > hidden.step_time_s
    assert any("reduction after backward, exposed" in a for a in after.assumptions)
    assert not any("reduction after backward" in a for a in hidden.assumptions)
    # stated true is the default
    assert _bert_dp(overlap_grad_reduce=True).step_time_s == pytest.approx(hidden.step_time_s)


def test_overlap_grad_reduce_is_not_deepspeeds_knob() -> None:
    with pytest.raises(GpuPlanError, match="deepspeed.overlap_comm"):
        parse_spec(
            {
                "model": "gpt2",
                "seq_len": 512,
                "framework": "deepspeed",
                "parallelism": {"sharding": "zero1", "overlap_grad_reduce": False},
            }
        )


def _gpt2_head(model: str):  # type: ignore[no-untyped-def]
    """GPT-2 small, bf16-mixed, micro-batch 32 of 1024 tokens, on one H200."""
    spec = {"model": model, "seq_len": 1024, "precision": "bf16-mixed", "micro_batch_size": 32}
    gpu = load_catalog(use_user=False).gpu("H200")
    return configure(parse_spec(spec), gpu, 1, default_topology(gpu, 1), require_fit=False).time


def test_an_unaligned_vocabulary_runs_the_lm_head_at_the_measured_slowdown(tmp_path: Path) -> None:
    """GPT-2's 50257-row LM head is not a multiple of 8: measured on an H200 its GEMMs ran
    4.8-4.9x longer than padded to 50304 (validation/pending/gemm_h200_20261204.csv). Hugging
    Face keeps the tokenizer's size; Megatron pads to a multiple of 128 x TP."""
    from gpuplan.estimate.compute import UNALIGNED_GEMM_SLOWDOWN, head_is_aligned

    assert not head_is_aligned(50257, 1, 1)
    assert head_is_aligned(50257, 2, 128)  # Megatron: 50432, 25216 rows a rank
    assert head_is_aligned(128256, 8, 1)
    assert not head_is_aligned(32001, 1, 1)
    repo = Path(__file__).resolve().parents[1]
    cfg = json.loads((repo / "src/gpuplan/models/data/gpt2.json").read_text())
    cfg["vocab_size"] = 50304
    padded_cfg = tmp_path / "gpt2-50304.json"
    padded_cfg.write_text(json.dumps(cfg))
    raw, padded = _gpt2_head("gpt2"), _gpt2_head(str(padded_cfg))
    head_raw, head_padded = raw.parts["lm head + loss"], padded.parts["lm head + loss"]
    # the GEMMs slow down by the measured factor; the fp32 loss passes do not
    assert 2.0 * head_padded < head_raw < UNALIGNED_GEMM_SLOWDOWN * head_padded
    assert raw.parts["gemm"] == pytest.approx(padded.parts["gemm"])
    assert any("not a multiple of 8" in a for a in raw.assumptions)
    assert not any("not a multiple of 8" in a for a in padded.assumptions)


def test_deepspeed_settings_are_checked() -> None:
    base = {"model": "gpt2", "seq_len": 512}
    with pytest.raises(GpuPlanError, match="deepspeed: its settings apply to framework deepspeed"):
        parse_spec({**base, "deepspeed": {"version": "0.5.0"}})
    with pytest.raises(GpuPlanError, match="deepspeed.version: 0.3.5 has no ZeRO-3"):
        parse_spec(
            {
                **base,
                "framework": "deepspeed",
                "deepspeed": {"version": "0.3.5"},
                "parallelism": {"sharding": "zero3"},
            }
        )


def test_memoised_estimates_match_cold_ones(cat) -> None:  # type: ignore[no-untyped-def]
    """The compute step and the memory steps 1-3 are cached on their arguments: a warm cache
    (filled by other layouts, GPUs and counts first) gives what a cold one does."""
    from gpuplan.estimate import activations, compute, memory
    from gpuplan.estimate.fit import memory_job, model_shape
    from gpuplan.estimate.speed import estimate_time
    from gpuplan.estimate.strategy import Strategy

    def clear() -> None:
        memory.clear_caches()
        for fn in (compute.transformer_step, compute.cnn_step):
            fn.cache_clear()
        activations.layer_items_cached.cache_clear()

    cases = []
    for model, layouts in (
        (
            "llama-3-8b",
            [
                dict(dp=8),
                dict(dp=8, sharding="zero3"),
                dict(tp=2, dp=4),
                dict(pp=2, dp=4, grad_accum=4),
            ],
        ),
        ("resnet-50", [dict(dp=1), dict(dp=8)]),
    ):
        text = {"seq_len": 1024} if model != "resnet-50" else {}
        spec = parse_spec({"model": model, "micro_batch_size": 2, **text})
        shape = model_shape(model)
        job = memory_job(spec, shape)
        for gpu_id in ("A100-80GB", "H100-SXM"):
            gpu = cat.gpu(gpu_id)
            for kw in layouts:
                st = Strategy(micro_batch_size=2, **kw)
                cases.append((shape, job, st, gpu, default_topology(gpu, st.gpus)))
    clear()
    warm = []
    for shape, job, st, gpu, topo in cases:
        t = estimate_time(shape, job, st, gpu, topo)
        m = memory.estimate_memory(shape, job, st, gpu)
        warm.append((t.step_time_s, t.parts, m.device_used_bytes, m.breakdown))
    for case, expected in zip(cases, warm, strict=True):
        clear()
        shape, job, st, gpu, topo = case
        t = estimate_time(shape, job, st, gpu, topo)
        m = memory.estimate_memory(shape, job, st, gpu)
        assert (t.step_time_s, t.parts, m.device_used_bytes, m.breakdown) == expected


def test_tensor_core_efficiency_follows_each_gpus_measured_matmul(cat) -> None:  # type: ignore[no-untyped-def]
    """Cards of one architecture share its fitted values, scaled by how much of the datasheet
    peak each reaches in a measured best matmul against the architecture's reference GPU:
    the A100 PCIe (79%) below the SXM (85%), the RTX 3090 (108% of its half-rate peak) above;
    bandwidth, and a card with no measurement (A10), stay at the architecture's tensor-core
    values. Plain fp32 follows its own measurements (test_plain_fp32_gemms_follow_...)."""
    effs = efficiencies()
    ampere = effs.archs["Ampere"]
    sxm, pcie = effs.arch(cat.gpu("A100-80GB")), effs.arch(cat.gpu("A100-80GB-PCIE"))
    rtx3090, a10 = effs.arch(cat.gpu("RTX-3090")), effs.arch(cat.gpu("A10"))
    assert sxm.gemm == ampere.gemm
    assert (a10.gemm, a10.gemm_fp8, a10.attention) == (
        ampere.gemm,
        ampere.gemm_fp8,
        ampere.attention,
    )
    pcie_fraction = cat.gpu("A100-80GB-PCIE").matmul_fraction
    assert pcie.gemm == pytest.approx(ampere.gemm * pcie_fraction / ampere.matmul_reference)
    assert pcie.attention / ampere.attention == pytest.approx(pcie.gemm / ampere.gemm)
    assert rtx3090.gemm > ampere.gemm and "RTX-3090" in rtx3090.basis
    # a card held above its rated boost clock keeps its measured speed: the ceiling is its own
    # best matmul (108% of the datasheet peak), not the datasheet peak
    rtx_fraction = cat.gpu("RTX-3090").matmul_fraction
    assert rtx_fraction > 1.0
    assert rtx3090.gemm == pytest.approx(
        min(rtx_fraction, ampere.gemm * rtx_fraction / ampere.matmul_reference)
    )
    assert rtx3090.gemm > 1.0
    assert pcie.hbm == ampere.hbm
    spec = parse_spec({"model": "bert-large", "seq_len": 384, "micro_batch_size": 32})
    step = {
        g: configure(spec, cat.gpu(g), 1, default_topology(cat.gpu(g), 1)).time.step_time_s
        for g in ("A100-80GB", "A100-80GB-PCIE")
    }
    assert step["A100-80GB-PCIE"] > step["A100-80GB"]  # same datasheet, less sustained


def _ttt(cat, work: dict[str, object], model: str = "llama-3-8b", **extra: object):  # type: ignore[no-untyped-def]
    shape = {"image_size": 224} if model == "resnet-50" else {"seq_len": 4096}
    spec = parse_spec(
        {
            "model": model,
            **shape,
            "precision": "bf16-mixed",
            "global_batch_size": 64,
            "work": work,
            **extra,
        }
    )
    gpu = cat.gpu("H100-SXM")
    return configure(spec, gpu, 8, default_topology(gpu, 8)).time


@pytest.mark.parametrize("model", ["llama-3-8b", "resnet-50"])
def test_evaluation_adds_forward_passes_to_the_run(cat, model: str) -> None:  # type: ignore[no-untyped-def]
    """work.eval_samples costs forward passes only: per sample about a third of a training
    step's (forward, against forward plus a backward of twice its FLOPs)."""
    base = _ttt(cat, {"samples": 64_000}, model)
    with_eval = _ttt(cat, {"samples": 64_000, "eval_samples": 6_400}, model)
    assert base.eval_s == 0.0
    assert with_eval.step_time_s == base.step_time_s
    assert with_eval.time_to_train_s == pytest.approx(base.time_to_train_s + with_eval.eval_s)
    per_train = base.time_to_train_s / 64_000
    per_eval = with_eval.eval_s / 6_400
    assert 0.2 < per_eval / per_train < 0.5, per_eval / per_train
    assert any(a.startswith("evaluation: 6400 samples") for a in with_eval.assumptions)


def test_each_evaluation_pass_rounds_up_and_fills_the_pipeline(cat) -> None:  # type: ignore[no-untyped-def]
    """work.evaluations splits eval_samples into passes: each rounds its last micro-batch up
    (100 samples over 8 ranks at micro-batch 1 are 13 forwards a pass, not 12.5), and under
    pipeline parallelism each pass fills the stages again (pp - 1 more forwards a pass)."""
    work = {"samples": 64_000, "eval_samples": 1_000}
    one = _ttt(cat, work, micro_batch_size=1)
    ten = _ttt(cat, {**work, "evaluations": 10}, micro_batch_size=1)
    assert ten.eval_s / one.eval_s == pytest.approx(10 * 13 / 125)
    assert any("in 10 passes" in a for a in ten.assumptions)
    pp = {"micro_batch_size": 1, "parallelism": {"pp": 4, "sharding": "zero1"}}
    one_pp = _ttt(cat, work, **pp)
    ten_pp = _ttt(cat, {**work, "evaluations": 10}, **pp)
    # dp 2: 500 samples a rank; one pass is 500 + 3 forwards, ten are 10 x (50 + 3)
    assert ten_pp.eval_s / one_pp.eval_s == pytest.approx(10 * 53 / 503)


@pytest.mark.parametrize(
    ("work", "field"),
    [
        ("{samples: 1000, eval_samples: -5}", "eval_samples"),
        ("{samples: 1000, evaluations: 4}", "evaluations"),  # evaluations need eval_samples
        ("{samples: 1000, eval_samples: 10, evaluations: 0}", "evaluations"),
        ("{samples: 1000, eval_samples: 10, evaluations: 11}", "evaluations"),  # a pass, a sample
    ],
)
def test_evaluation_work_is_checked(cli, tmp_path: Path, work: str, field: str) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "job.yaml"
    spec.write_text(f"model: gpt2\nwork: {work}\n")
    result = cli("estimate", str(spec), "--gpu", "H100-SXM", "--json")
    assert result.exit_code == 2
    assert field in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 2


def test_a_gpu_without_pcie_p2p_talks_through_host_memory(cat) -> None:  # type: ignore[no-untyped-def]
    """The RTX 4090 has no PCIe peer-to-peer on NVIDIA's driver (``gpus.yaml`` ``pcie_p2p``,
    sourced): NCCL moves its data through host memory, the ``pcie-no-p2p`` link."""
    eff = efficiencies()
    rtx, l40s = cat.gpu("RTX-4090"), cat.gpu("L40S")
    assert not rtx.pcie_p2p and rtx.pcie_p2p_source
    assert l40s.pcie_p2p
    slow = comm.intra_link(rtx, default_topology(rtx, 2, intra_node="pcie"), eff)
    fast = comm.intra_link(l40s, default_topology(l40s, 2, intra_node="pcie"), eff)
    assert slow.name == "pcie-no-p2p" and fast.name == "pcie"
    assert slow.bandwidth < fast.bandwidth


def test_nvlink_without_a_switch_is_bridged_pairs_only_for_pcie_cards(cat) -> None:  # type: ignore[no-untyped-def]
    """PCIe cards are joined two at a time by NVLink bridges, so a ring over four crosses PCIe;
    SXM GPUs on a 4-GPU HGX board are all joined by NVLink, at the NVLink bandwidth."""
    eff = efficiencies()
    sxm, card = cat.gpu("H100-SXM"), cat.gpu("A100-80GB-PCIE")
    assert sxm.form_factor == "sxm" and card.form_factor == "pcie"
    mesh = comm.intra_link(sxm, default_topology(sxm, 4, intra_node="nvlink"), eff)
    switch = comm.intra_link(sxm, default_topology(sxm, 8, intra_node="nvswitch"), eff)
    assert mesh.name == "nvlink" and mesh.bandwidth == pytest.approx(switch.bandwidth)
    assert mesh.bandwidth == pytest.approx(sxm.nvlink_bandwidth_gb_per_s / 2 * 1e9 * 0.80)
    pairs = comm.intra_link(card, default_topology(card, 4, intra_node="nvlink"), eff)
    two = comm.intra_link(card, default_topology(card, 2, intra_node="nvlink"), eff)
    assert pairs.name == "nvlink pairs + pcie" and two.name == "nvlink"
    assert pairs.bandwidth < two.bandwidth / 5


def test_pcie_p2p_false_needs_its_source() -> None:
    from gpuplan.catalog.schema import GpuSpec

    rtx = load_catalog(use_user=False).gpu("RTX-4090").model_dump()
    rtx["pcie_p2p_source"] = None
    with pytest.raises(ValueError, match="pcie_p2p_source"):
        GpuSpec.model_validate(rtx)


def test_peft_mfu_counts_no_weight_gradient_for_the_frozen_base(cat) -> None:  # type: ignore[no-untyped-def]
    """MFU's model FLOPs are what the method needs: a frozen base runs forward and input
    gradient (4N), so an fp32 LoRA step at the plain-fp32 GEMM level stays under 100%."""
    base = {
        "model": "falcon-40b",
        "precision": "fp32",
        "optimizer": "sgd-momentum",
        "micro_batch_size": 2,
        "seq_len": 512,
        "global_batch_size": 128,
        "parallelism": {"sharding": "zero3", "tp": 1, "pp": 1},
    }
    gpu = cat.gpu("H100-SXM")
    topo = default_topology(gpu, 8)
    lora = configure(parse_spec({**base, "method": "lora"}), gpu, 8, topo, require_fit=False)
    full = configure(parse_spec({**base, "method": "full"}), gpu, 8, topo, require_fit=False)
    assert 0 < lora.time.mfu < 1
    flops_lora = lora.time.mfu * lora.time.step_time_s
    flops_full = full.time.mfu * full.time.step_time_s
    # linears 4N against 6N; attention and the rest keep their share, so a little over 2/3
    assert 0.66 < flops_lora / flops_full < 0.70


@pytest.mark.parametrize(
    ("capability", "transposes"),
    [("8.9", True), ("9.0", True), ("10.0", False), ("11.0", False), ("12.0", True), (None, True)],
)
def test_fp8_gemms_take_tn_only_before_data_centre_blackwell(
    capability: str | None, transposes: bool
) -> None:
    """Transformer Engine's ``is_non_tn_fp8_gemm_supported``: 10.x, 11.x and 13+ only."""
    from gpuplan.estimate.compute import fp8_needs_transposes

    assert fp8_needs_transposes(capability) is transposes


def test_fp8_casts_write_the_transposed_copies_a_tn_gemm_needs(cat, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """On Hopper each fp8 cast also writes a transposed copy: one more byte per element of every
    linear's input, output gradient and weight (the weight's alone for a frozen base)."""
    import gpuplan.estimate.speed as speed
    from gpuplan.estimate.calibration import efficiencies
    from gpuplan.estimate.configure import spec_shape

    gpu = cat.gpu("H100-SXM")
    topo = default_topology(gpu, 8)
    hbm = efficiencies().archs["Hopper"].hbm
    for method in ("full", "lora"):
        spec = _long_seq_spec(
            seq_len=4096, precision="fp8-mixed", activation_checkpointing="none", method=method
        )
        with_t = configure(spec, gpu, 8, topo, require_fit=False)
        monkeypatch.setattr(speed, "fp8_needs_transposes", lambda _cc: False)
        without = configure(spec, gpu, 8, topo, require_fit=False)
        monkeypatch.undo()
        shape = spec_shape(spec)
        st = with_t.strategy
        tokens = st.micro_batch_size * 4096
        per_layer = sum(
            (tokens * (lin.in_features + lin.out_features) if method == "full" else 0)
            + lin.in_features * lin.out_features
            for lin in shape.linears
        )
        m = st.grad_accum
        expected = m * shape.layers * per_layer / (gpu.memory_bandwidth_gb_per_s * 1e9 * hbm)
        diff = with_t.time.parts["elementwise"] - without.time.parts["elementwise"]
        assert diff == pytest.approx(expected, rel=1e-9)
    # data-centre Blackwell reads the other layouts: no copies
    b200 = cat.gpu("B200")
    assert not speed.fp8_needs_transposes(b200.compute_capability)


def test_gradients_cross_the_wire_in_the_engines_gradient_dtype(cat) -> None:  # type: ignore[no-untyped-def]
    """Megatron reduces its main_grad buffer: bf16 unless grad_reduce_in_fp32; torch autocast's
    gradients are fp32 (the parameters' dtype); DeepSpeed's are 16-bit."""
    gpu = cat.gpu("H100-SXM")
    topo = default_topology(gpu, 16, inter_node_gbps=400, fabric="infiniband")

    def comm_s(**kw: object) -> float:
        spec = parse_spec(
            {
                "model": "llama-3-8b",
                "seq_len": 4096,
                "precision": "bf16-mixed",
                "parallelism": {"sharding": "none", "tp": 1, "pp": 1},
                **kw,
            }
        )
        return configure(spec, gpu, 16, topo, require_fit=False).time.comm_total_s

    fp32 = comm_s(framework="megatron", megatron={"grad_reduce_in_fp32": True})
    bf16 = comm_s(framework="megatron", megatron={"grad_reduce_in_fp32": False})
    assert 1.9 < fp32 / bf16 <= 2.0
    assert comm_s(framework="hf") == pytest.approx(fp32, rel=1e-9)
    assert comm_s(framework="deepspeed") == pytest.approx(bf16, rel=1e-9)


def test_the_distributed_optimizer_gathers_parameters_as_megatron_stores_them(cat) -> None:  # type: ignore[no-untyped-def]
    """Megatron's distributed optimizer all-gathers its bf16 model parameters after the step,
    under an fp8 recipe too; only fp8_param_gather (spec megatron.fp8_params) gathers fp8."""
    gpu = cat.gpu("H100-SXM")
    topo = default_topology(gpu, 16, inter_node_gbps=400, fabric="infiniband")

    def comm_s(precision: str, **megatron: object) -> float:
        spec = parse_spec(
            {
                "model": "llama-3-8b",
                "seq_len": 4096,
                "precision": precision,
                "framework": "megatron",
                "megatron": {"grad_reduce_in_fp32": False, **megatron},
                "parallelism": {"sharding": "zero1", "tp": 1, "pp": 1},
            }
        )
        return configure(spec, gpu, 16, topo, require_fit=False).time.comm_total_s

    bf16 = comm_s("bf16-mixed")
    assert comm_s("fp8-mixed") == pytest.approx(bf16, rel=1e-9)
    assert comm_s("fp8-mixed", fp8_params=True) < bf16


def test_autocast_moves_fp32_weights_each_micro_batch(cat) -> None:  # type: ignore[no-untyped-def]
    """Under torch autocast an fp32 linear weight is cast to 16 bits once a micro-batch, and its
    gradient cast back and accumulated into ``.grad``: 6 + 6 bytes a weight, 12 more from the
    second micro-batch, 6 more with full checkpointing's recompute. A model that stores 16-bit
    weights (DeepSpeed), FSDP (gathered in 16 bits) and fp32 pay none."""
    gpu = cat.gpu("A100-80GB")
    base = {
        "model": "gpt2-large",
        "method": "full",
        "precision": "fp16-mixed",
        "micro_batch_size": 1,
        "seq_len": 1024,
        "activation_checkpointing": "none",
        "framework": "hf",
        "global_batch_size": 1,
        "parallelism": {"sharding": "none", "tp": 1, "pp": 1},
    }

    def casts(**kw: object) -> float:
        spec = parse_spec({**base, **kw})
        return configure(spec, gpu, 1, default_topology(gpu, 1)).time.parts["autocast weight casts"]

    shape_weights = 36 * 12 * 1280**2 + 50257 * 1280  # the linears' weights and the tied head
    hbm = gpu.memory_bandwidth_gb_per_s * 1e9 * efficiencies().arch(gpu).hbm
    one = casts()
    assert one == pytest.approx(shape_weights * 12 / hbm, rel=0.01)
    four = casts(global_batch_size=4)  # 4 micro-batches, 3 of them accumulate in place
    assert four == pytest.approx(4 * shape_weights * (12 + 12 * 3 / 4) / hbm, rel=0.01)
    assert casts(activation_checkpointing="full") == pytest.approx(
        shape_weights * 18 / hbm, rel=0.01
    )
    assert casts(framework="deepspeed") == 0.0
    assert casts(precision="fp32") == 0.0
    assert casts(method="lora") == 0.0
    # a pipeline runs on a pipeline engine, which keeps 16-bit weights
    staged = Strategy(sharding="none", tp=1, pp=2, dp=1, micro_batch_size=1, grad_accum=2)
    job = memory_job(parse_spec(base), model_shape("gpt2-large"))
    assert (
        speed_mod._autocast_weight_traffic_s(
            model_shape("gpt2-large"), job, staged, layout_for(job, staged), 18, 1, hbm
        )
        == 0.0
    )


def test_stated_fused_kernels_and_loss_are_priced_in_time(cat) -> None:  # type: ignore[no-untyped-def]
    """``fused_kernels`` prices the element-wise passes over what the fused kernels keep and
    the fused-kernel launch count; ``loss_kernel: fused`` one 16-bit read and write of the
    logits in place of the eager loss's three fp32 passes. Unstated, the time is as before."""
    gpu = cat.gpu("H100-SXM")
    base = {
        "model": "llama-3.2-1b",
        "method": "full",
        "precision": "bf16-mixed",
        "micro_batch_size": 1,
        "global_batch_size": 1,
        "seq_len": 4096,
        "activation_checkpointing": "full",
        "framework": "hf",
        "parallelism": {"sharding": "none", "tp": 1, "pp": 1},
    }

    def parts(**kw: object) -> dict[str, float]:
        spec = parse_spec({**base, **kw})
        return configure(spec, gpu, 1, default_topology(gpu, 1)).time.parts

    eager = parts()
    fused = parts(fused_kernels=True)
    assert fused["elementwise"] < 0.8 * eager["elementwise"]
    assert fused["kernel launches"] < 0.5 * eager["kernel launches"]
    assert fused["gemm"] == eager["gemm"]
    loss = parts(loss_kernel="fused")
    tokens, vocab = 4096, 128256
    hbm = gpu.memory_bandwidth_gb_per_s * 1e9 * efficiencies().arch(gpu).hbm
    saved = tokens * vocab * (3 * 4 - 2 * 2) / hbm  # three fp32 passes -> two 16-bit ones
    assert eager["lm head + loss"] - loss["lm head + loss"] == pytest.approx(saved, rel=0.01)
    assert parts(fused_kernels=False) == eager and parts(loss_kernel="eager") == eager
