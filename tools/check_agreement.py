"""Teacher-forced agreement of two targets' plans on one checkpoint, on this machine's CPU.

  python -m ember.tools.check_agreement [--shape qwen2.5-1.5b] [--positions 256] [--target h200]
  python -m ember.tools.check_agreement --model PATH [--text tests/fixtures/real/passage.txt] ...

Runs the cpu target (fp32) and `--target`'s plan (traced for the CPU: its kernels' jnp emulations, in its own
activation dtype) over the same tokens, prints top-1 agreement, mean / max KL(cpu || target) and how peaked
the reference distribution is (median top-1 probability, median gap between the two largest logits).
Synthetic shapes (random weights) read a random prompt; `--model` (a real GGUF file or HF folder) reads
`--text` through the model's own tokenizer, as a user's text would be.
What it answers: how much of the GPU agreement test's disagreement (tests/test_gpu_engine.py, random
weights) the plan's dtype alone explains, kernels aside, and whether real weights' distributions, which
are peaked, keep the same argmax. Writes nothing; prints one JSON object.

`--int8-activations float|one|two` runs the target on GGUF weights kept packed (no dense copies) in 16-row
prefill chunks (within the decode GEMV's row bound), its Q4_K / Q6_K matmuls as the decode GEMVs compute
them: "float", on the activations as they are (the float kernels); "one" and "two", on one or two int8 terms
per 32-element block (gguf_gemv/act_quant.py, the kernel policy's quant_gemv.act_terms: the integer-dot kernel). What it answers: how far
the decode path's int8 activations alone move the logits on real weights, per number of terms.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from unittest import mock

import numpy as np

PASSAGE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "real" / "passage.txt"


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def int8_activation_matmul(mode: str):
    """quant_matmul_ref's stand-in: x [m, in] @ W.T with x as it is (mode "float") or as the integer-dot GEMV
    sees it with one or two int8 terms ("one", "two"); other formats as they are."""
    from ember.compiler.kernels.gguf_gemv import act_quant
    from ember.compiler.kernels.gguf_gemv.reference import quant_matmul_ref

    def matmul(x, w):
        if mode == "float" or w.format not in act_quant.PACKINGS:
            return quant_matmul_ref(x, w)
        return act_quant.dp4a_matmul_ref(x, w, terms=1 if mode == "one" else 2).astype(x.dtype)

    return matmul


@contextlib.contextmanager
def _int8_activations(mode: str | None):
    if mode is None:
        yield None
        return
    with mock.patch("ember.compiler.kernels.gguf_gemv.matmul.quant_matmul_ref", int8_activation_matmul(mode)):
        yield 16  # prefill chunk: every projection stays on the GEMV path


# --int8-activations: GGUF weights kept packed, without dense copies
KEPT_PACKED = {"weights.quantized_formats": ["q4_k", "q6_k", "q8_0", "q5_0"], "weights.dense_copies": False}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--target", default="h200")
    parser.add_argument("--model", help="a real checkpoint (GGUF file or HF folder) instead of --shape")
    parser.add_argument("--text", default=str(PASSAGE), help="the text --model is teacher-forced on")
    parser.add_argument("--reference-dtype", help="run the cpu target in this dtype (default: its own, float32)")
    parser.add_argument("--target-dtype", help="run --target in this dtype (default: its own)")
    parser.add_argument(
        "--int8-activations",
        choices=("float", "one", "two"),
        help="the target's Q4_K / Q6_K matmuls on int8 activations (see above)",
    )
    args = parser.parse_args(argv)
    from ember.compiler.spec import spec_for_arch
    from ember.runtime.execution.sequence_runner import SequenceRunner
    from ember.runtime.loading.model import effective_policy, load_model
    from ember.runtime.loading.synthetic import synthetic_checkpoint
    from ember.tools.bench_models import SYNTHETIC_SHAPES

    if args.model:
        from ember.runtime.loading.checkpoint import open_checkpoint
        from ember.runtime.loading.text.prompting import load_tokenizer

        checkpoint = lambda: open_checkpoint(args.model)  # noqa: E731
        tokens = load_tokenizer(checkpoint()).encode(open(args.text).read())[: args.positions]
    else:
        arch, config = SYNTHETIC_SHAPES[args.shape]
        checkpoint = lambda: synthetic_checkpoint(spec_for_arch(arch), config)  # noqa: E731
        tokens = np.random.default_rng(7).integers(0, config["vocab_size"], args.positions).tolist()

    def logits(target, dtype, int8):
        with _int8_activations(int8) as chunk:
            policy = None if int8 is None else effective_policy(target).overridden(KEPT_PACKED)
            model = load_model(checkpoint(), target=target, activation_dtype=dtype, kernel_policy=policy)
            runner = SequenceRunner(model, len(tokens), prefill_chunk=chunk)
            return runner.prefill(tokens, all_logits=True).astype(np.float64)

    exact = logits("cpu", args.reference_dtype, None)
    other = logits(args.target, args.target_dtype, args.int8_activations)
    p_exact, p_other = _log_softmax(exact), _log_softmax(other)
    kl = (np.exp(p_exact) * (p_exact - p_other)).sum(-1)
    top2 = np.sort(exact, -1)[:, -2:]
    print(
        json.dumps(
            {
                "checkpoint": args.model or f"synthetic:{args.shape}",
                "positions": len(tokens),
                "tokens": "text: " + Path(args.text).name if args.model else "random",
                "target": f"{args.target}, {args.target_dtype or 'its own dtype'}"
                + (f", int8 activations: {args.int8_activations}" if args.int8_activations else ""),
                "reference": f"cpu target, {args.reference_dtype or 'float32'}",
                "top1_agreement": float((exact.argmax(-1) == other.argmax(-1)).mean()),
                "mean_kl": float(kl.mean()),
                "max_kl": float(kl.max()),
                "reference_median_top1_prob": float(np.median(np.exp(p_exact.max(-1)))),
                "reference_median_top1_top2_logit_gap": float(np.median(top2[:, 1] - top2[:, 0])),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
