"""Count the kernel-launching ops of one layer of Hugging Face's eager models, forward and backward.

The time model prices each kernel launch (``compute.EAGER_KERNELS_PER_LAYER``); this script is
where those counts come from. It builds tiny configurations of Llama, GPT-2 and BERT (the op
sequence does not depend on the sizes), runs a training step of a 2-layer and a 1-layer model
under a ``TorchDispatchMode`` on the CPU, and prints the difference: one layer's ops, views and
allocations left out. Needs the ``trace`` extra (torch and transformers); nothing is downloaded.

    python scripts/count_eager_kernels.py
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable
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


def layer_ops(build: Callable[[int], Any], vocab: int = 100) -> collections.Counter[str]:
    """Ops of one layer: a training step of a 2-layer model less that of a 1-layer model."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: collections.Counter[str] = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    counts = []
    for layers in (1, 2):
        torch.manual_seed(0)
        model = build(layers)
        ids = torch.randint(0, vocab, (2, 16))
        with Count() as c:
            model(input_ids=ids, labels=ids).loss.backward()
        counts.append(c.ops)
    diff = collections.Counter(counts[1])
    diff.subtract(counts[0])
    return collections.Counter({k: v for k, v in diff.items() if v > 0 and k not in NO_KERNEL})


def main() -> int:
    try:
        import torch
        import transformers as tf
    except ImportError:
        print("needs torch and transformers: pip install -e '.[trace]'", file=sys.stderr)
        return 2

    def llama(n: int) -> Any:
        cfg = tf.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, num_hidden_layers=n, vocab_size=100,
        )  # fmt: skip
        cfg._attn_implementation = "sdpa"
        return tf.LlamaForCausalLM(cfg).to(torch.bfloat16)

    def gpt2(n: int) -> Any:
        cfg = tf.GPT2Config(n_embd=64, n_head=4, n_layer=n, vocab_size=100)
        cfg._attn_implementation = "eager"
        return tf.GPT2LMHeadModel(cfg)

    def bert(n: int) -> Any:
        cfg = tf.BertConfig(
            hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_hidden_layers=n, vocab_size=100,
        )  # fmt: skip
        cfg._attn_implementation = "eager"
        return tf.BertForMaskedLM(cfg)

    print(f"transformers {tf.__version__}, torch {torch.__version__}")
    for name, build in (("llama", llama), ("gpt2", gpt2), ("bert", bert)):
        ops = layer_ops(build)
        top = ", ".join(f"{k} {v}" for k, v in ops.most_common(8))
        print(f"{name}: {sum(ops.values())} ops per layer, forward and backward ({top}, ...)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
