"""Teacher-forced agreement of two targets' plans on one synthetic checkpoint, on this machine's CPU.

  python -m ember.tools.check_agreement [--shape qwen2.5-1.5b] [--positions 256] [--target h200]

Runs the cpu target (fp32) and `--target`'s plan (traced for the CPU: its kernels' jnp emulations, in its own
activation dtype) over the same random prompt, prints top-1 agreement, mean / max KL(cpu || target) and how
peaked the reference distribution is (median top-1 probability, median gap between the two largest logits).
What it answers: how much of the GPU agreement test's disagreement (tests/test_gpu_engine.py) the plan's
dtype alone explains, kernels aside. Writes nothing; prints one JSON object.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--target", default="h200")
    args = parser.parse_args(argv)
    from ember.compiler.spec import spec_for_arch
    from ember.runtime.model import load_model
    from ember.runtime.sequence_runner import SequenceRunner
    from ember.runtime.synthetic import synthetic_checkpoint
    from ember.tools.bench import SYNTHETIC_SHAPES

    arch, config = SYNTHETIC_SHAPES[args.shape]
    tokens = np.random.default_rng(7).integers(0, config["vocab_size"], args.positions).tolist()
    logits = {}
    for target in ("cpu", args.target):
        model = load_model(synthetic_checkpoint(spec_for_arch(arch), config), target=target)
        runner = SequenceRunner(model, args.positions)
        logits[target] = runner.prefill(tokens, all_logits=True).astype(np.float64)
    exact, other = logits["cpu"], logits[args.target]
    p_exact, p_other = _log_softmax(exact), _log_softmax(other)
    kl = (np.exp(p_exact) * (p_exact - p_other)).sum(-1)
    top2 = np.sort(exact, -1)[:, -2:]
    print(json.dumps({"shape": args.shape, "positions": args.positions, "target": args.target,
                      "top1_agreement": float((exact.argmax(-1) == other.argmax(-1)).mean()),
                      "mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
                      "reference_median_top1_prob": float(np.median(np.exp(p_exact.max(-1)))),
                      "reference_median_top1_top2_logit_gap": float(np.median(top2[:, 1] - top2[:, 0]))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
