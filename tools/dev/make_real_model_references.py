"""Record transformers' fp32 outputs for the real GGUF checkpoints, as small test fixtures.

Run in the torch environment (Python 3.11, torch CPU, transformers, gguf):

    /work/venv311/bin/python tools/dev/make_real_model_references.py [--model NAME ...]

transformers loads each GGUF itself (its gguf integration dequantizes every tensor to fp32,
undoes llama.cpp's +1 on Gemma norm weights and maps names), together with the tokenizer
rebuilt from the GGUF metadata. For each model it writes tests/fixtures/real/<name>.npz:

    text_ids             int32   [T]        passage.txt encoded by the HF tokenizer (BOS if it adds one)
    top_ids              int32   [T, 128]   ids of the 128 largest log-probs at each position, desc
    top_logprobs         float32 [T, 128]   those log_softmax values (row t predicts token t+1)
    argmax               int32   [T]
    greedy_prompt_ids_k  int32   [P_k]      k = 0..4
    greedy_out_k         int32   [32]       pure argmax continuation (no logits processors, EOS not special)
    greedy_margin_k      float32 [32]       top1 - top2 logit at each greedy step (how fragile the choice is)

and <name>.json with prompt texts, versions and the config transformers derived from the GGUF.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny_checkpoints import write_npz_deterministic  # noqa: E402  (sibling script)

TOP_K = 128
GREEDY_NEW_TOKENS = 32
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "real"
DEFAULT_MODELS_DIR = Path.home() / ".cache" / "ember" / "models"
# Config fields worth recording so a reader can see what transformers made of the GGUF metadata.
_CONFIG_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_parameters",
    "tie_word_embeddings",
    "sliding_window",
    "layer_types",
    "query_pre_attn_scalar",
    "final_logit_softcapping",
    "attn_logit_softcapping",
    "hidden_activation",
    "hidden_act",
    "max_position_embeddings",
    "bos_token_id",
    "eos_token_id",
)


@dataclass(frozen=True)
class RealModel:
    name: str  # fixture file stem
    gguf_file: str
    raw_prompts: tuple[str, ...]
    chat_prompts: tuple[tuple[dict[str, str], ...], ...] = field(default=())


# The Qwen2.5-Coder models (the default and its draft) share these prompts.
_QWEN_CODER_RAW_PROMPTS = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The three primary colors of light are",
    "# Sort a list of dictionaries by the 'age' key\n"
    'people = [{"name": "Ann", "age": 31}, {"name": "Bo", "age": 25}]\n',
)
_QWEN_CODER_CHAT_PROMPTS = (
    ({"role": "user", "content": "Write a Python function that checks whether a string is a palindrome."},),
    (
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "What does the `yield` keyword do in Python? Answer in two sentences."},
    ),
)

MODELS = (
    RealModel(
        name="qwen2.5-coder-1.5b-instruct",
        gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        raw_prompts=_QWEN_CODER_RAW_PROMPTS,
        chat_prompts=_QWEN_CODER_CHAT_PROMPTS,
    ),
    RealModel(
        name="qwen2.5-coder-0.5b-instruct",
        gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        raw_prompts=_QWEN_CODER_RAW_PROMPTS,
        chat_prompts=_QWEN_CODER_CHAT_PROMPTS,
    ),
    RealModel(
        name="gemma-3-270m",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        raw_prompts=(
            "The capital of France is",
            "Once upon a time, in a small village by the sea,",
            "def add(a, b):\n    return",
            "Water boils at 100 degrees Celsius at sea level. At higher altitudes, water boils at",
            "Here is a list of fruits:\n1. Apple\n2.",
        ),
    ),
)


def load(models_dir: Path, model: RealModel) -> tuple[torch.nn.Module, object]:
    tokenizer = AutoTokenizer.from_pretrained(models_dir, gguf_file=model.gguf_file)
    hf_model = AutoModelForCausalLM.from_pretrained(
        models_dir, gguf_file=model.gguf_file, dtype=torch.float32, attn_implementation="eager"
    )
    return hf_model.eval(), tokenizer


@torch.no_grad()
def teacher_forced(hf_model: torch.nn.Module, ids: list[int]) -> dict[str, np.ndarray]:
    """Top-128 log-probs at every position of one forward over the passage."""
    logits = hf_model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()  # [T, vocab]
    logprobs = torch.log_softmax(logits, dim=-1)
    top = torch.topk(logprobs, TOP_K, dim=-1, sorted=True)
    return {
        "text_ids": np.asarray(ids, dtype=np.int32),
        "top_ids": top.indices.to(torch.int32).numpy(),
        "top_logprobs": top.values.numpy().astype(np.float32),
        "argmax": logits.argmax(dim=-1).to(torch.int32).numpy(),
    }


@torch.no_grad()
def greedy(hf_model: torch.nn.Module, prompt_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Pure argmax decoding with the KV cache: exactly 32 tokens, EOS treated like any token."""
    out = hf_model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
    cache, logits = out.cache, out.logits[0, -1].float()
    tokens, margins = [], []
    for step in range(GREEDY_NEW_TOKENS):
        top2 = torch.topk(logits, 2).values
        token = int(logits.argmax())
        tokens.append(token)
        margins.append(float(top2[0] - top2[1]))
        if step + 1 == GREEDY_NEW_TOKENS:
            break
        out = hf_model(
            input_ids=torch.tensor([[token]]),
            cache=cache,
            use_cache=True,
            cache_position=torch.tensor([len(prompt_ids) + step]),
        )
        cache, logits = out.cache, out.logits[0, -1].float()
    return np.asarray(tokens, dtype=np.int32), np.asarray(margins, dtype=np.float32)


def prompt_texts(model: RealModel, tokenizer) -> list[tuple[str, str, bool]]:
    """(kind, text, add_special_tokens) per greedy prompt; chat ones rendered by the GGUF's template."""
    prompts = [("raw", text, True) for text in model.raw_prompts]
    for messages in model.chat_prompts:
        rendered = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        prompts.append(("chat", rendered, False))  # the template already holds its special tokens
    return prompts


def make_reference(models_dir: Path, out_dir: Path, model: RealModel, passage: str) -> dict[str, float]:
    timings: dict[str, float] = {}
    start = time.perf_counter()
    hf_model, tokenizer = load(models_dir, model)
    timings["load_s"] = time.perf_counter() - start

    start = time.perf_counter()
    text_ids = tokenizer(passage)["input_ids"]
    arrays = teacher_forced(hf_model, text_ids)
    timings["forward_s"] = time.perf_counter() - start
    tail_mass = 1.0 - np.exp(arrays["top_logprobs"].astype(np.float64)).sum(axis=-1)

    start = time.perf_counter()
    prompts = prompt_texts(model, tokenizer)
    for k, (_, text, special) in enumerate(prompts):
        prompt_ids = tokenizer(text, add_special_tokens=special)["input_ids"]
        tokens, margins = greedy(hf_model, prompt_ids)
        arrays[f"greedy_prompt_ids_{k}"] = np.asarray(prompt_ids, dtype=np.int32)
        arrays[f"greedy_out_{k}"] = tokens
        arrays[f"greedy_margin_{k}"] = margins
    timings["greedy_s"] = time.perf_counter() - start

    write_npz_deterministic(out_dir / f"{model.name}.npz", arrays)
    config = hf_model.config.to_dict()
    meta = {
        "model": model.name,
        "gguf_file": model.gguf_file,
        "passage_file": "passage.txt",
        "passage_tokens": len(text_ids),
        "tokenizer_adds_bos": bool(tokenizer.bos_token_id is not None and text_ids[0] == tokenizer.bos_token_id),
        "top_k": TOP_K,
        "max_tail_mass": float(tail_mass.max()),
        "greedy_new_tokens": GREEDY_NEW_TOKENS,
        "greedy_prompts": [
            {
                "kind": kind,
                "text": text,
                "add_special_tokens": special,
                "continuation_text": tokenizer.decode(arrays[f"greedy_out_{k}"].tolist()),
            }
            for k, (kind, text, special) in enumerate(prompts)
        ],
        "hf_config": {key: config[key] for key in _CONFIG_KEYS if key in config},
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__, "numpy": np.__version__},
        "dtype": "float32",
        "attn_implementation": "eager",
    }
    (out_dir / f"{model.name}.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    timings["max_tail_mass"] = float(tail_mass.max())
    timings["min_greedy_margin"] = float(min(arrays[f"greedy_margin_{k}"].min() for k in range(len(prompts))))
    return timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--model", action="append", help="only these fixture names (repeatable)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    passage = (args.out / "passage.txt").read_text(encoding="utf-8")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for model in MODELS:
        if args.model and model.name not in args.model:
            continue
        stats = make_reference(args.models_dir, args.out, model, passage)
        print(f"{model.name}: " + ", ".join(f"{k}={v:.4g}" for k, v in stats.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
