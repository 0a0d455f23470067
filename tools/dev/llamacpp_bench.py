"""llama.cpp side by side with Ember, on the same machine and the same GGUF layouts (run by hand on the
device machine; the issue's peer figures come from this kind of run).

1. builds llama-bench and llama-batched-bench from llama.cpp's source (a folder or a .tar.xz; the PyPI sdist
   of llama-cpp-python 0.3.36 vendors it; tools/dev/trim_llamacpp_source.sh trims it to ~2 MB),
   with CUDA for sm_90 when nvcc is on PATH, else for the CPU;
2. writes each model as a GGUF file with tools/write_gguf.py (`synthetic:<shape>[-q4_k_m]`: the tensors,
   shapes and llama.cpp quantization types Ember's benchmark suite loads);
3. runs llama-bench (batch-1 decode at depth 0 and `--depths`, prefill of `--prompts` tokens) and
   llama-batched-bench (`--streams` sequences of `--stream-prompt` → `--stream-gen` tokens, lockstep), all
   with flash attention and every layer on the GPU;
4. writes llamacpp.json (raw records + the figures) and llamacpp.md.

  python -m ember.tools.dev.llamacpp_bench --src .whl/llama.cpp-trimmed.tar.xz --tokenizer .gpu/tok \
      --models synthetic:llama3-8b synthetic:qwen2.5-1.5b-q4_k_m --out $OUT/llamacpp --commit SHA
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

BENCHES = ("llama-bench", "llama-batched-bench")


def build(src: Path, build_dir: Path, *, cuda: bool, jobs: int) -> Path:
    """Configure and build the two benches; returns the folder holding them."""
    if src.is_file():
        with tarfile.open(src) as archive:
            archive.extractall(build_dir / "src", filter="data")
        src = next(p.parent for p in (build_dir / "src").glob("*/CMakeLists.txt"))
    flags = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
    ]
    if cuda:
        flags += ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"]
    out = build_dir / "build"
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), *flags], check=True, capture_output=True, text=True)
    subprocess.run(
        ["cmake", "--build", str(out), "--target", *BENCHES, "-j", str(jobs)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out / "bin"


def bench_command(
    binary: Path, model: Path, *, prompts: list[int], depths: list[int], gen: int, gpu: bool, repetitions: int
) -> list[str]:
    return [
        str(binary),
        "-m",
        str(model),
        "-ngl",
        "99" if gpu else "0",
        "-fa",
        "1",
        "-r",
        str(repetitions),
        "-p",
        ",".join(map(str, prompts)),
        "-n",
        str(gen),
        "-d",
        ",".join(map(str, depths)),
        "-o",
        "json",
    ]


def batched_command(binary: Path, model: Path, *, streams: list[int], prompt: int, gen: int, gpu: bool) -> list[str]:
    context = max(streams) * (prompt + gen)
    return [
        str(binary),
        "-m",
        str(model),
        "-ngl",
        "99" if gpu else "0",
        "-fa",
        "on",
        "-c",
        str(context),
        "-b",
        "2048",
        "-ub",
        "512",
        "-npp",
        str(prompt),
        "-ntg",
        str(gen),
        "-npl",
        ",".join(map(str, streams)),
        "--output-format",
        "jsonl",
    ]


def parse_bench(stdout: str) -> list[dict]:
    """llama-bench -o json: one record per test -> {kind, tokens, depth, tok_s, stddev}."""
    rows = []
    for record in json.loads(stdout):
        prompt, gen = int(record["n_prompt"]), int(record["n_gen"])
        rows.append(
            {
                "kind": "prefill" if prompt else "decode",
                "tokens": prompt or gen,
                "depth": int(record.get("n_depth", 0)),
                "tok_s": round(float(record["avg_ts"]), 2),
                "stddev": round(float(record["stddev_ts"]), 2),
            }
        )
    return rows


def parse_batched(stdout: str) -> list[dict]:
    """llama-batched-bench --output-format jsonl: one line per stream count -> its figures."""
    rows = []
    for line in stdout.splitlines():
        line = line.strip()
        if not (line.startswith("{") and '"speed_tg"' in line):
            continue
        record = json.loads(line)
        rows.append(
            {
                "streams": int(record["pl"]),
                "prompt": int(record["pp"]),
                "gen": int(record["tg"]),
                "decode_tok_s": round(float(record["speed_tg"]), 2),
                "prefill_tok_s": round(float(record["speed_pp"]), 2),
                "overall_tok_s": round(float(record["speed"]), 2),
            }
        )
    return rows


def markdown(result: dict) -> str:
    lines = [
        f"# llama.cpp side by side — {result['device']}",
        "",
        f"Ember commit {result['commit']}; llama.cpp from {result['source']}; built for "
        f"{'CUDA sm_90' if result['gpu'] else 'the CPU'}; flash attention on; random weights at real shapes "
        "(tools/write_gguf.py).",
        "",
    ]
    for name, entry in result["models"].items():
        lines += [f"## {name}", ""]
        if "error" in entry:
            lines += [f"error: {entry['error']}", ""]
            continue
        lines += ["| test | tok/s |", "|---|---|"]
        for row in entry["bench"]:
            test = (
                f"decode {row['tokens']} tokens at depth {row['depth']}"
                if row["kind"] == "decode"
                else f"prefill {row['tokens']} tokens at depth {row['depth']}"
            )
            lines.append(f"| {test} | {row['tok_s']:,.1f} ± {row['stddev']:,.1f} |")
        for row in entry["batched"]:
            lines.append(
                f"| {row['streams']} streams, {row['prompt']} → {row['gen']} tokens: decode (prefill) | "
                f"{row['decode_tok_s']:,.1f} ({row['prefill_tok_s']:,.1f}) |"
            )
        lines.append("")
    return "\n".join(lines)


def gguf_file(name: str, work: Path, tokenizer: Path) -> tuple[Path, int]:
    """(path, bytes) of the synthetic model `name` as a GGUF file under `work`, written unless already there."""
    from ..write_gguf import synthetic_checkpoint, write_gguf

    path = work / (name.replace(":", "_") + ".gguf")
    if not path.exists():
        checkpoint, vocab = synthetic_checkpoint(name)
        write_gguf(checkpoint, tokenizer, vocab, path.with_suffix(".partial"))
        path.with_suffix(".partial").rename(path)
    return path, path.stat().st_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", type=Path, required=True, help="llama.cpp source folder or .tar.xz")
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--models", nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ember-llamacpp"))
    parser.add_argument("--cpu", action="store_true", help="build and run on the CPU even if nvcc is there")
    parser.add_argument("--prompts", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--depths", type=int, nargs="+", default=[0, 4096])
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--stream-prompt", type=int, default=256)
    parser.add_argument("--stream-gen", type=int, default=256)
    args = parser.parse_args(argv)
    gpu = not args.cpu and shutil.which("nvcc") is not None
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # The GGUF files are written by worker processes while the build runs (both are CPU work, independent).
    with concurrent.futures.ProcessPoolExecutor(max_workers=2) as pool:
        files = {name: pool.submit(gguf_file, name, args.work, args.tokenizer) for name in args.models}
        bin_dir = build(args.src, args.work, cuda=gpu, jobs=os.cpu_count() or 2)
        build_s = round(time.perf_counter() - started, 1)
        result = {
            "commit": args.commit,
            "device": "GPU (CUDA)" if gpu else "CPU",
            "gpu": gpu,
            "source": args.src.name,
            "build_s": build_s,
            "models": {},
        }
        for name in args.models:
            entry = result["models"][name] = {}
            try:
                path, entry["gguf_bytes"] = files[name].result()
                run = lambda cmd: subprocess.run(cmd, check=True, capture_output=True, text=True).stdout  # noqa: E731
                entry["bench"] = parse_bench(
                    run(
                        bench_command(
                            bin_dir / "llama-bench",
                            path,
                            prompts=args.prompts,
                            depths=args.depths,
                            gen=args.gen,
                            gpu=gpu,
                            repetitions=args.repetitions,
                        )
                    )
                )
                entry["batched"] = parse_batched(
                    run(
                        batched_command(
                            bin_dir / "llama-batched-bench",
                            path,
                            streams=args.streams,
                            prompt=args.stream_prompt,
                            gen=args.stream_gen,
                            gpu=gpu,
                        )
                    )
                )
            except (subprocess.CalledProcessError, OSError, ValueError) as error:
                detail = getattr(error, "stderr", "") or ""
                entry["error"] = f"{type(error).__name__}: {error} {detail[-2000:]}".strip()
            (args.out / "llamacpp.json").write_text(json.dumps(result, indent=1))
    (args.out / "llamacpp.md").write_text(markdown(result))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
