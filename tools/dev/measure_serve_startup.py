"""Time `ember serve` to its "serving" line, cold (fresh cache directory) or warm, and one batch-1 decode.

    .venv/bin/python -m ember.tools.dev.measure_serve_startup --cache DIR [--model NAME] [--out FILE]

DIR is used as EMBER_CACHE_DIR: its models/ is a link to ~/.cache/ember/models (the checkpoint is not
downloaded again), everything else in it (JAX's persistent cache, Ember's executables) starts empty the first
time and is reused the next: run it twice with the same DIR for a cold then a warm figure. Every output line
(the progress bars' redraws included, split at carriage returns) is stamped with seconds since the start, so
the load, each step shape's compile and the background compiles can be read off the log (the progress lines
carry their own seconds: a pipe may deliver them late). After the serving line, a first request of 8 tokens
(its time to first token), then (--wait-background: once every shape is compiled) one streamed completion of
--tokens tokens gives batch-1 decode tok/s (first to last token), then (when the start writes a prepared-weights
entry, runtime/loading/prepared_weights.py) once that entry is written, the server is stopped. The load average is sampled at start, at the serving line and at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path


def _load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def _stream_completion(port: int, model: str, tokens: int) -> dict:
    body = {
        "model": model,
        "prompt": "def fibonacci(n):",
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    sent, stamps = time.perf_counter(), []
    with urllib.request.urlopen(request, timeout=900) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: {") and '"text"' in line:
                stamps.append(time.perf_counter())
    if len(stamps) < 2:
        return {"chunks": len(stamps)}
    return {
        "chunks": len(stamps),
        "ttft_s": round(stamps[0] - sent, 2),
        "decode_tok_s": round((len(stamps) - 1) / (stamps[-1] - stamps[0]), 2),
    }


def _measured(port: int, model: str, tokens: int) -> dict:
    try:
        return _stream_completion(port, model, tokens)
    except Exception as error:  # the startup figures stand without it
        return {"error": f"{type(error).__name__}: {error}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", required=True, type=Path)
    parser.add_argument("--model", default=None)
    parser.add_argument("--port", type=int, default=18931)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--wait-background", action="store_true", help="after decoding, wait for 'all step shapes'")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("serve_args", nargs="*")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    models = args.cache / "models"
    if not models.exists():
        models.symlink_to(Path.home() / ".cache" / "ember" / "models")
    jax_cache = args.cache / "jax-cache"
    cold = not jax_cache.exists()
    env = dict(os.environ, EMBER_CACHE_DIR=str(args.cache), PYTHONUNBUFFERED="1")
    command = ["ember", "serve", "--port", str(args.port), *(["--model", args.model] if args.model else [])]
    command += args.serve_args
    start = time.perf_counter()
    result: dict = {"command": " ".join(command), "cold": cold, "load_average_start": _load_average()}
    result["jax_cache_files_start"] = len(list(jax_cache.glob("*/*"))) if jax_cache.exists() else 0
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[tuple[float, str]] = []
    serving = threading.Event()
    background_done = threading.Event()
    prepared_writing, prepared_done = threading.Event(), threading.Event()

    def read() -> None:
        buffer = b""
        while chunk := process.stdout.read1(4096):
            buffer += chunk
            *done, buffer = buffer.replace(b"\r", b"\n").split(b"\n")
            for piece in done:
                text = piece.decode(errors="replace").strip()
                if text:
                    lines.append((round(time.perf_counter() - start, 2), text))
                    print(f"[{lines[-1][0]:7.2f}] {text}", flush=True)
                    if text.startswith("Ember is serving"):
                        serving.set()
                    if "all step shapes" in text:
                        background_done.set()
                    if "writing prepared weights" in text:
                        prepared_writing.set()
                    if "prepared weights written" in text or "prepared weights not written" in text:
                        prepared_done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not serving.wait(1800):
            raise SystemExit("no serving line in 30 minutes")
        result["ready_s"] = round(time.perf_counter() - start, 2)
        result["load_average_ready"] = _load_average()
        result["jax_cache_files_ready"] = len(list(jax_cache.glob("*/*")))
        result["serving_line"] = next(text for _, text in lines if text.startswith("Ember is serving"))
        served = result["serving_line"].removeprefix("Ember is serving ").split(" (")[0]
        # a newcomer's first request, straight after the serving line (beside any background compile)
        result["first_request"] = _measured(args.port, served, 8)
        if args.wait_background:
            background_done.wait(1800)
            result["background_done_s"] = round(time.perf_counter() - start, 2)
            result["load_average_background_done"] = _load_average()
        result["decode"] = _measured(args.port, served, args.tokens)
        result["load_average_end"] = _load_average()
        if prepared_writing.is_set():  # a cold start's prepared-weights entry: the warm run after it reads it
            prepared_done.wait(900)
            written = [t for t, text in lines if "prepared weights written" in text]
            result["prepared_weights_written_s"] = written[0] if written else None
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
        reader.join(5)
    result["jax_cache_files_end"] = len(list(jax_cache.glob("*/*")))
    result["log"] = lines
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "log"}, indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()
