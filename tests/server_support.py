"""A small chat model for server tests and a live `ember serve` subprocess around it.

The model is a 2-layer Qwen2-architecture checkpoint with random weights at tiny width, but the real
Qwen2.5 tokenizer and chat template (taken from the default model's GGUF), so every protocol path —
templates with tools, special tokens, stop strings, grammars over a 151k vocabulary — runs for real in
seconds. Its text is random: tests assert protocol behaviour, not prose (grammars make JSON and tool
calls valid regardless).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REAL_MODEL_NAME = "qwen2.5-coder-1.5b-instruct"  # the name the real default model is served under (real_server)
# the live test servers' engine settings: few sequences and step shapes to compile on CPU
SERVER_ARGS = ("--max-num-seqs", "4", "--max-batched-tokens", "128", "--ctx", "2048", "--heartbeat-s", "0.5")
TINY_QWEN_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
    "torch_dtype": "float32",
}


# Qwen3's vocabulary is Qwen2.5's with these added tokens next (ids 151665-151668).
QWEN3_ADDED_TOKENS = ("<tool_response>", "</tool_response>", "<think>", "</think>")


def write_tiny_chat_model(
    folder: Path, gguf_path: Path, *, seed: int = 0, chat_template: str | None = None, qwen3_tokens: bool = False
) -> Path:
    """An HF folder: config, random safetensors weights, tokenizer.json + chat template from the GGUF.
    `chat_template` replaces the GGUF's template; `qwen3_tokens` adds Qwen3's think and tool-response
    tokens, making the vocabulary Qwen3's (so the server parses `<think>` blocks)."""
    from safetensors.numpy import save_file

    from ember.runtime.loading.checkpoint import open_checkpoint
    from ember.runtime.loading.text.tokenizer import Tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "model.safetensors").exists():
        return folder
    metadata = open_checkpoint(gguf_path).metadata
    tokenizer = Tokenizer.from_gguf_metadata(metadata, source=str(gguf_path))
    backend = json.loads(tokenizer.backend.to_str())
    if qwen3_tokens:  # the GGUF's padding entries at those ids become Qwen3's added tokens
        vocab = backend["model"]["vocab"]
        for token_id, text in enumerate(QWEN3_ADDED_TOKENS, start=151665):
            del vocab[f"[PAD{token_id}]"]
            vocab[text] = token_id
            backend["added_tokens"].append(
                {"id": token_id, "content": text, "single_word": False, "lstrip": False, "rstrip": False}
                | {"normalized": False, "special": False}
            )
    (folder / "tokenizer.json").write_text(json.dumps(backend))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": chat_template or tokenizer.chat_template,
                "eos_token": "<|im_end|>",
                "bos_token": None,
                "pad_token": "<|endoftext|>",
                "add_bos_token": False,
            }
        )
    )
    (folder / "config.json").write_text(json.dumps(TINY_QWEN_CONFIG))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    rng = np.random.default_rng(seed)
    c = TINY_QWEN_CONFIG
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    dh = d // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * dh

    def w(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    tensors = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": np.ones(d, np.float32)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors.update(
            {
                p + "input_layernorm.weight": np.ones(d, np.float32),
                p + "post_attention_layernorm.weight": np.ones(d, np.float32),
                p + "self_attn.q_proj.weight": w(d, d),
                p + "self_attn.q_proj.bias": w(d),
                p + "self_attn.k_proj.weight": w(kv, d),
                p + "self_attn.k_proj.bias": w(kv),
                p + "self_attn.v_proj.weight": w(kv, d),
                p + "self_attn.v_proj.bias": w(kv),
                p + "self_attn.o_proj.weight": w(d, d),
                p + "mlp.gate_proj.weight": w(f, d),
                p + "mlp.up_proj.weight": w(f, d),
                p + "mlp.down_proj.weight": w(d, f),
            }
        )
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """`ember serve` in a subprocess; `url` once /health says ok."""

    def __init__(self, model: Path, *extra_args: str, env: dict | None = None, ready_timeout: float = 600):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = model.parent / f"serve-{self.port}.log"
        args = [
            sys.executable,
            "-m",
            "ember.tools.cli",
            "serve",
            "--model",
            str(model),
            "--port",
            str(self.port),
            # every step shape before ready, none compiled between the tests' requests (their timings assume so)
            "--no-background-compile",
            *extra_args,
        ]
        full_env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=full_env)
        self._wait_ready(ready_timeout)

    def _wait_ready(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"ember serve exited ({self.process.returncode}):\n{self.log()}")
            try:
                health = httpx.get(self.url + "/health", timeout=2)
                if health.status_code == 200:
                    return
                if health.json().get("status") == "failed":
                    self.stop()
                    raise RuntimeError(f"ember serve failed to load the model:\n{self.log()}")
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"ember serve not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:  # stop() closes it; the log is read after a failed start too
            self._log.flush()
        return self.log_path.read_text()

    def signal(self, sig=signal.SIGTERM) -> None:
        self.process.send_signal(sig)

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode
