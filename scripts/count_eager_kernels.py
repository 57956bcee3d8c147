"""Count the kernel-launching ops of one layer of Hugging Face's eager models, forward and backward.

The time model prices each kernel launch (``compute.EAGER_KERNELS_PER_LAYER``); this script is
where those counts come from. It builds tiny configurations of Llama, GPT-2 and BERT (the op
sequence does not depend on the sizes), runs a training step of a 2-layer and a 1-layer model
under a ``TorchDispatchMode`` on the CPU, and prints the difference: one layer's ops, views and
allocations left out. Needs the ``trace`` extra (torch and transformers); nothing is downloaded.

With ``--bytes`` it counts, instead, the element-wise memory traffic of one layer: the bytes of
every tensor read or written by an op that is not a GEMM, an attention kernel, an embedding or
a view, per token, under CUDA autocast's rules (``gpuplan.trace.autocast``), with the module
cast to 16 bits, and in fp32. Each tensor's bytes are attributed to its width (hidden,
feed-forward, query, key/value, GPT-2's fused QKV, per-token scalars) and printed per unit of
that width, the whole step and the forward alone; attention scores and masks (tensors ending
in seq x seq) are left out, as the score passes price them. docs/accuracy.md ("Eager
element-wise traffic counted") uses these figures.

    python scripts/count_eager_kernels.py [--bytes]

Without ``--bytes`` it also counts the fp32 models under CUDA autocast's rules, whose casts are
kernels of their own (``compute.EAGER_KERNELS_PER_LAYER_AUTOCAST``).
"""

from __future__ import annotations

import collections
import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

NO_KERNEL = frozenset(
    {
        "_reshape_alias", "_unsafe_view", "alias", "as_strided", "chunk", "detach", "diagonal",
        "empty", "empty_like", "empty_strided", "expand", "expand_as", "flatten", "lift_fresh",
        "narrow", "new_empty", "new_empty_strided", "permute", "reshape", "select", "slice",
        "split", "split_with_sizes", "squeeze", "t", "transpose", "unbind", "unflatten",
        "unsqueeze", "view", "view_as", "_local_scalar_dense", "sym_size", "is_same_size",
    }
)  # fmt: skip
"""Ops that make a view or an uninitialised tensor: no kernel runs."""


def builders(
    tf: Any, *, hidden: int, ffn: int, head_dim: int, kv_heads: int
) -> tuple[Callable[[int], Any], Callable[[int], Any], Callable[[int], Any]]:
    """Tiny transformers Llama (SDPA), GPT-2 and BERT (eager attention), by layer count."""

    def llama(n: int) -> Any:
        cfg = tf.LlamaConfig(
            hidden_size=hidden, intermediate_size=ffn, num_attention_heads=4,
            head_dim=head_dim, num_key_value_heads=kv_heads, num_hidden_layers=n,
            vocab_size=100,
        )  # fmt: skip
        cfg._attn_implementation = "sdpa"
        return tf.LlamaForCausalLM(cfg)

    def gpt2(n: int) -> Any:
        cfg = tf.GPT2Config(n_embd=hidden, n_head=4, n_layer=n, vocab_size=100, n_inner=ffn)
        cfg._attn_implementation = "eager"
        return tf.GPT2LMHeadModel(cfg)

    def bert(n: int) -> Any:
        cfg = tf.BertConfig(
            hidden_size=hidden, intermediate_size=ffn, num_attention_heads=4,
            num_hidden_layers=n, vocab_size=100,
        )  # fmt: skip
        cfg._attn_implementation = "eager"
        return tf.BertForMaskedLM(cfg)

    return llama, gpt2, bert


@contextlib.contextmanager
def sdpa_under_autocast() -> Iterator[None]:
    """SDPA on the emulated CUDA autocast's lower-precision list while counting (as the
    tracer's shim in ``gpuplan.trace.run`` puts it), restored after."""
    import torch

    from gpuplan.trace import autocast as ac

    low = set(ac._LOW)
    ac._LOW.add(torch.nn.functional.scaled_dot_product_attention)
    try:
        yield
    finally:
        ac._LOW.clear()
        ac._LOW.update(low)


def layer_ops(
    build: Callable[[int], Any], vocab: int = 100, *, autocast: bool = False
) -> collections.Counter[str]:
    """Ops of one layer: a training step of a 2-layer model less that of a 1-layer model. With
    ``autocast``, the forward runs under CUDA autocast's rules in fp16 (emulated on the CPU by
    ``gpuplan.trace.autocast``), whose casts (``_to_copy``) are kernels too."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from gpuplan.trace import autocast as ac

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: collections.Counter[str] = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    counts = []
    with sdpa_under_autocast():
        for layers in (1, 2):
            torch.manual_seed(0)
            model = build(layers)
            ids = torch.randint(0, vocab, (2, 16))
            with Count() as c:
                mode = ac.CudaAutocast(torch.float16) if autocast else contextlib.nullcontext()
                with mode:
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
            counts.append(c.ops)
    diff = collections.Counter(counts[1])
    diff.subtract(counts[0])
    return collections.Counter({k: v for k, v in diff.items() if v > 0 and k not in NO_KERNEL})


GEMM_LIKE = frozenset(
    {
        "mm", "addmm", "bmm", "baddbmm", "embedding", "embedding_dense_backward",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    }
)  # fmt: skip
"""Ops the time model prices as GEMMs, attention or the embedding, not as element-wise work."""

BATCH, SEQ = 3, 7
"""Token grid of the byte count: 7 divides no weight's size (the widths below are products of
2, 3 and 5), so a tensor is per-token exactly when its size is a multiple of 21."""
WIDTHS = {"hidden": 96, "ffn": 160, "q": 176, "kv": 44}
"""Tiny widths, all distinct (a Llama head of 44: 4 query heads, 1 key/value head), so each
tensor's width names what it is; rotate_half's halves (88, 22) count with q and kv."""


def layer_bytes(
    build: Callable[[int], Any], mode: str, widths: dict[int, str]
) -> tuple[dict[str, float], dict[str, float]]:
    """Element-wise bytes per token of one layer by width class: (whole step, forward)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from gpuplan.trace import autocast as ac

    def tensors(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            for v in x:
                yield from tensors(v)
        elif isinstance(x, dict):
            for v in x.values():
                yield from tensors(v)

    class Bytes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.step: collections.Counter[str] = collections.Counter()
            self.fwd: collections.Counter[str] = collections.Counter()
            self.backward = False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            if name in NO_KERNEL or name in GEMM_LIKE:
                return out
            ts = [*tensors(args), *tensors(kwargs or {}), *tensors(out)]
            if any(t.dim() >= 2 and t.shape[-1] == SEQ == t.shape[-2] for t in ts):
                return out  # attention scores and masks
            for t in ts:
                if t.numel() % (BATCH * SEQ) == 0 and t.numel() // (BATCH * SEQ) in widths:
                    cls = widths[t.numel() // (BATCH * SEQ)]
                    nbytes = t.numel() * t.element_size() / (BATCH * SEQ)
                    self.step[cls] += nbytes
                    if not self.backward:
                        self.fwd[cls] += nbytes
            return out

    runs = []
    with sdpa_under_autocast():
        for layers in (1, 2):
            torch.manual_seed(0)
            model = build(layers)
            if mode == "cast16":
                model = model.to(torch.bfloat16)
            model.train()
            ids = torch.randint(0, 100, (BATCH, SEQ))
            with Bytes() as m:
                if mode == "autocast":
                    with ac.CudaAutocast(torch.bfloat16):
                        loss = model(input_ids=ids, labels=ids).loss
                else:
                    loss = model(input_ids=ids, labels=ids).loss
                m.backward = True
                loss.backward()
            runs.append(m)
    one, two = runs
    return (
        {k: two.step[k] - one.step[k] for k in two.step},
        {k: two.fwd[k] - one.fwd[k] for k in two.fwd},
    )


def main() -> int:
    try:
        import torch
        import transformers as tf
    except ImportError:
        print("needs torch and transformers: pip install -e '.[trace]'", file=sys.stderr)
        return 2
    if "--bytes" in sys.argv[1:]:
        return print_bytes(tf)

    llama, gpt2, bert = builders(tf, hidden=64, ffn=128, head_dim=16, kv_heads=2)
    bf16_llama = lambda n: llama(n).to(torch.bfloat16)  # noqa: E731
    print(f"transformers {tf.__version__}, torch {torch.__version__}")
    for name, build in (("llama", bf16_llama), ("gpt2", gpt2), ("bert", bert)):
        ops = layer_ops(build)
        top = ", ".join(f"{k} {v}" for k, v in ops.most_common(8))
        print(f"{name}: {sum(ops.values())} ops per layer, forward and backward ({top}, ...)")
    # the fp32 models under autocast (compute.EAGER_KERNELS_PER_LAYER_AUTOCAST)
    for name, build in (("llama", llama), ("gpt2", gpt2), ("bert", bert)):
        ops = layer_ops(build, autocast=True)
        print(f"{name} under autocast: {sum(ops.values())} ops ({ops['_to_copy']} casts)")
    return 0


def print_bytes(tf: Any) -> int:
    """Print one eager layer's element-wise bytes per token per unit of each width."""
    h, f, hd = WIDTHS["hidden"], WIDTHS["ffn"], WIDTHS["q"] // 4

    llama, gpt2, bert = builders(tf, hidden=h, ffn=f, head_dim=hd, kv_heads=1)
    base = {h: "hidden", f: "ffn", 1: "scalar"}
    models = (
        ("llama", llama, {**base, 4 * hd: "q", 2 * hd: "q", hd: "kv", hd // 2: "kv"}),
        ("gpt2", gpt2, {**base, 3 * h: "qkv"}),
        ("bert", bert, base),
    )
    per_unit = {"hidden": h, "ffn": f, "q": 4 * hd, "kv": hd, "qkv": 3 * h, "scalar": 1}
    print(f"transformers {tf.__version__}: element-wise bytes per token per unit of width")
    for name, build, widths in models:
        for mode in ("autocast", "cast16", "fp32"):
            step, fwd = layer_bytes(build, mode, widths)
            show = lambda d: ", ".join(f"{k} {v / per_unit[k]:.0f}" for k, v in sorted(d.items()))  # noqa: E731
            print(f"{name} {mode}: step {show(step)}; forward {show(fwd)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
