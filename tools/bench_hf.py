"""HF transformers baseline for the benchmark suite: decode tok/s of a random-weight model at a real shape.

Runs under PyTorch (the suite runs it as a subprocess; it imports nothing from Ember):
    python tools/bench_hf.py --config shape.json --batch 1 32 --prompt-tokens 256 --new-tokens 256 \
        --device cuda --compile auto --out hf.json

The model is built from the config (HF config.json keys, `model_type` included) in bf16 on the device,
weights initialised randomly by transformers (no checkpoint, no network). Generation is greedy with a
static KV cache (generation_config.cache_implementation = "static") and torch.compile as transformers'
"Optimizing inference" guide shows it (--compile auto, the default: generate compiles the decode forward
itself and prepares the static cache for it; --compile forward: model.forward = torch.compile(model.forward,
mode="reduce-overhead", fullgraph=True, dynamic=False) with generate's own compile switched off; --compile
none: eager, for CPU checks). The forward mode failed on the H200 with transformers 5.17 (
docs/results/h200_hf_smoke_810ea24.json): with generate's compile off the static cache's buffers are created
inside the first captured CUDA graph, and the next replay overwrote them ("accessing tensor output of
CUDAGraphs that has been overwritten by a subsequent run", in the cache's update).

Each batch size runs once untimed (compilation, CUDA graph capture), then --repeats timed runs. Every
prompt is `prompt_tokens` random ids; min_new_tokens = max_new_tokens, so EOS never ends a row early.
Decode tok/s = batch × (steps after the first token) ÷ (time from the first generated token to the last),
from a stopping criterion that records (after a device sync) when each step's token is there — the same
definition as Ember's figure (prefill excluded).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

COMPILE_MODES = ("forward", "auto", "none")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_hf", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="JSON file of HF config keys (with model_type)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--compile", choices=COMPILE_MODES, default="auto")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs per batch size (the best is kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the JSON result here (default: stdout)")
    args = parser.parse_args(argv)
    for name in ("prompt_tokens", "new_tokens", "repeats"):
        if getattr(args, name) < 1 or (name == "new_tokens" and args.new_tokens < 2):
            parser.error(f"--{name.replace('_', '-')} is too small: {getattr(args, name)}")
    if any(b < 1 for b in args.batch):
        parser.error(f"--batch sizes must be >= 1: {args.batch}")
    return args


def decode_rate(stamps: list[float], batch: int) -> dict:
    """Figures of one generate() from the times each step's tokens were ready (stamps[0]: the first token,
    which ends prefill)."""
    if len(stamps) < 2 or stamps[-1] <= stamps[0]:
        raise ValueError(f"need two or more increasing step times, got {len(stamps)}")
    steps = len(stamps) - 1
    seconds = stamps[-1] - stamps[0]
    return {
        "decode_steps": steps,
        "decode_s": round(seconds, 4),
        "ms_per_step": round(1e3 * seconds / steps, 3),
        "decode_tokens_per_s": round(batch * steps / seconds, 2),
    }


def best_run(runs: list[dict]) -> dict:
    """The timed run with the highest decode rate, with every run's rate kept beside it."""
    best = max(runs, key=lambda r: r["decode_tokens_per_s"])
    return {**best, "all_decode_tokens_per_s": [r["decode_tokens_per_s"] for r in runs]}


def bytes_per_step(model, batch: int, context: int) -> int:
    """Bytes one decode step reads (Ember's roofline rule): every parameter except an input embedding
    that is only gathered from (untied), plus each row's K and V at `context` tokens."""
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed or embed is head)
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = c.num_hidden_layers * context * c.num_key_value_heads * head_dim * 2 * embed.element_size()
    return int(weights + batch * kv)


def build_model(config: dict, device: str, dtype_name: str, seed: int):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    keys = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    hf_config = AutoConfig.for_model(config["model_type"], **keys)
    dtype = getattr(torch, dtype_name)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)  # random init, on the device
    return model.eval()


def _stamp_criteria(device: str, stamps: list[float]):
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StepClock(StoppingCriteria):  # never stops; records when each step's tokens exist
        def __call__(self, input_ids, scores, **kwargs):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([StepClock()])


def run_batch(model, batch: int, args) -> dict:
    import torch

    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(args.seed + batch)

    def once() -> tuple[float, list[float]]:
        ids = torch.randint(0, vocab, (batch, args.prompt_tokens), generator=generator).to(args.device)
        stamps: list[float] = []
        begun = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                pad_token_id=0,
                stopping_criteria=_stamp_criteria(args.device, stamps),
            )
        if out.shape[1] != args.prompt_tokens + args.new_tokens:
            raise RuntimeError(f"generate stopped early: {out.shape[1] - args.prompt_tokens} of {args.new_tokens}")
        return begun, stamps

    warm_begun = time.perf_counter()
    once()  # compilation and graph capture happen here
    warmup_s = time.perf_counter() - warm_begun
    runs = []
    for _ in range(args.repeats):
        begun, stamps = once()
        runs.append({**decode_rate(stamps, batch), "prefill_s": round(stamps[0] - begun, 4)})
    return {
        "batch": batch,
        "warmup_s": round(warmup_s, 1),
        **best_run(runs),
        "decode_rows": batch,
        "bytes_per_step": bytes_per_step(model, batch, args.prompt_tokens + args.new_tokens // 2),
    }


def run(args) -> dict:
    import torch
    import transformers

    config = json.loads(Path(args.config).read_text())
    begun = time.perf_counter()
    model = build_model(config, args.device, args.dtype, args.seed)
    init_s = time.perf_counter() - begun
    model.generation_config.cache_implementation = "static"
    if args.compile == "forward":
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True, dynamic=False)
        model.generation_config.disable_compile = True  # one compiled forward, not generate's as well
    elif args.compile == "none":
        model.generation_config.disable_compile = True
    result = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": _device_name(args.device),
        "dtype": args.dtype,
        "compile": args.compile,
        "cache": "static",
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "init_s": round(init_s, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "runs": [],
    }
    for batch in args.batch:
        try:
            result["runs"].append(run_batch(model, batch, args))
        except Exception as error:  # e.g. out of memory at one batch size: record it, try the next
            result["runs"].append({"batch": batch, "error": f"{type(error).__name__}: {str(error)[:1500]}"})
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    return result


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device.startswith("cuda") else device


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
