"""Convert the tiny MoE / hybrid checkpoints to GGUF with llama.cpp's own converter.

Run in the torch environment (Python 3.11, torch CPU, transformers):

    /work/venv311/bin/python tools/dev/make_hybrid_gguf.py [--arch qwen3_next ...]

llama.cpp's code is not in this repository: the script takes `convert_hf_to_gguf.py`, its
`conversion/` package and its `gguf-py/` out of the llama-cpp-python 0.3.36 sdist (downloaded
with `pip download` into ~/.cache/ember/llamacpp-sdist when absent) and runs it on each
tests/fixtures/tiny/<arch>/ with `--outtype f32`, writing model.f32.gguf next to the checkpoint
and gguf_tensors.json (every tensor's name, ggml dims and type, plus the non-tokenizer metadata).

One patch, around the tokenizer only: the converter names the BPE pre-tokenizer by hashing
the ids its fixed test text encodes to, and knows no hash for our 256-token byte tokenizer. The
wrapper answers "qwen2" (the regex these families use) when the converter finds none; tensors
and every other key are the converter's own.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
import tarfile
from pathlib import Path

SDIST_VERSION = "0.3.36"
REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_DIR = REPO_ROOT / "tests" / "fixtures" / "tiny"
CACHE = Path(os.environ.get("EMBER_LLAMACPP_SDIST", Path.home() / ".cache" / "ember" / "llamacpp-sdist"))
# Not qwen3_moe: its tiny checkpoint has a dense-MLP layer (mlp_only_layers), which llama.cpp's
# qwen3moe architecture has no tensors for (the converter stops: "Can not map tensor
# 'model.layers.1.mlp.down_proj.weight'"). Real Qwen3-MoE checkpoints are MoE in every layer.
HYBRID_ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
FALLBACK_PRE_TOKENIZER = "qwen2"
_WANTED = ("vendor/llama.cpp/convert_hf_to_gguf.py", "vendor/llama.cpp/conversion/", "vendor/llama.cpp/gguf-py/")


def converter_dir() -> Path:
    """Where the sdist's llama.cpp converter is unpacked (downloading the sdist if needed)."""
    root = CACHE / f"llama_cpp_python-{SDIST_VERSION}"
    llama = root / "vendor" / "llama.cpp"
    if (llama / "convert_hf_to_gguf.py").exists() and (llama / "conversion").is_dir():
        return llama
    tarball = CACHE / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    if not tarball.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*pip, f"llama-cpp-python=={SDIST_VERSION}", "-d", str(CACHE)], check=True)
    with tarfile.open(tarball) as archive:
        members = [m for m in archive.getmembers() if any(w in m.name for w in _WANTED)]
        archive.extractall(CACHE, members=members, filter="data")
    return llama


def _run_converter(llama: Path, argv: list[str]) -> None:
    """Run convert_hf_to_gguf.py in this process, with the pre-tokenizer fallback patched in."""
    sys.path[:0] = [str(llama), str(llama / "gguf-py")]
    import conversion.base as base  # the converter's own package, importable now

    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            return FALLBACK_PRE_TOKENIZER

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    saved_argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", *argv]
    try:
        runpy.run_path(str(llama / "convert_hf_to_gguf.py"), run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise
    finally:
        sys.argv = saved_argv


def _jsonable(value):
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def describe_gguf(path: Path) -> dict:
    """Tensor names, ggml dims (ne0 first) and types; metadata except the token lists."""
    import gguf  # the converter's gguf-py, on sys.path after _run_converter

    reader = gguf.GGUFReader(path)
    metadata = {}
    for field in reader.fields.values():
        if field.name.startswith(("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")):
            continue
        if field.name.startswith("GGUF."):
            continue
        metadata[field.name] = _jsonable(field.contents())
    tensors = [{"name": t.name, "ne": [int(n) for n in t.shape], "type": t.tensor_type.name} for t in reader.tensors]
    return {"metadata": metadata, "tensors": tensors}


def convert(arch: str, llama: Path, tiny_dir: Path = TINY_DIR) -> Path:
    folder = tiny_dir / arch
    out = folder / "model.f32.gguf"
    _run_converter(llama, [str(folder), "--outtype", "f32", "--outfile", str(out)])
    description = describe_gguf(out)
    (folder / "gguf_tensors.json").write_text(json.dumps(description, indent=1) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", choices=HYBRID_ARCHS, help="only these families (repeatable)")
    args = parser.parse_args(argv)
    llama = converter_dir()
    for arch in args.arch or HYBRID_ARCHS:
        out = convert(arch, llama)
        print(f"{arch}: {out.relative_to(REPO_ROOT)} {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
