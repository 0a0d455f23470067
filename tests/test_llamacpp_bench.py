"""tools/write_gguf.py writes the synthetic checkpoints as GGUF files the gguf reader (and llama.cpp) load, with
the tensors' types and bytes of the checkpoint Ember benchmarks; tools/dev/llamacpp_bench.py builds the benches'
command lines and reads their outputs."""

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from ember.tools.dev.llamacpp_bench import batched_command, bench_command, markdown, parse_batched, parse_bench
from ember.tools.write_gguf import bpe_vocabulary, synthetic_checkpoint, write_gguf


def test_the_vocabulary_is_fitted_to_the_model(bpe_tokenizer):
    tokens, types, merges = bpe_vocabulary(bpe_tokenizer, 9)
    assert tokens[:7] == ["a", "b", "c", "ab", "abc", "d", "<|end|>"] and tokens[7:] == ["[PAD7]", "[PAD8]"]
    assert types[6] == 3 and types[7] == 4 and types[0] == 1  # control, user-defined padding, normal
    assert merges == ["a b", "ab c"]  # "c d" makes "cd", which is no token
    cut, _, cut_merges = bpe_vocabulary(bpe_tokenizer, 4)
    assert cut == ["a", "b", "c", "ab"] and cut_merges == ["a b"]  # "ab c" lost its result


@pytest.mark.parametrize(
    "model, kinds",
    [("synthetic:qwen2-tiny-q4_k_m", {"Q8_0", "Q5_0", "F32"}), ("synthetic:qwen2-tiny", {"BF16", "F32"})],
)
def test_the_file_holds_the_checkpoints_tensors(model, kinds, bpe_tokenizer, tmp_path):
    checkpoint, vocab = synthetic_checkpoint(model)
    path = tmp_path / "model.gguf"
    assert write_gguf(checkpoint, bpe_tokenizer, vocab, path) == path.stat().st_size
    reader = GGUFReader(path)
    source = checkpoint._gguf
    assert {t.name for t in reader.tensors} == set(source.tensors)
    assert {t.tensor_type.name for t in reader.tensors} <= kinds
    for tensor in reader.tensors:
        info = source.tensors[tensor.name]
        assert tuple(int(n) for n in reversed(tensor.shape)) == tuple(info.shape)  # GGUF lists ne0 first
        assert np.array_equal(np.asarray(tensor.data).view(np.uint8).reshape(-1), source.raw(tensor.name))
    fields = reader.fields
    assert len(fields["tokenizer.ggml.tokens"].data) == vocab
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "qwen2"


def test_command_lines_and_outputs():
    bench = bench_command(
        Path("llama-bench"), Path("m.gguf"), prompts=[512, 4096], depths=[0, 4096], gen=128, gpu=True, repetitions=3
    )
    assert bench[bench.index("-p") + 1] == "512,4096" and bench[bench.index("-d") + 1] == "0,4096"
    assert bench[bench.index("-ngl") + 1] == "99" and bench[bench.index("-fa") + 1] == "1"
    batched = batched_command(
        Path("llama-batched-bench"), Path("m.gguf"), streams=[1, 8, 32], prompt=256, gen=256, gpu=False
    )
    assert batched[batched.index("-c") + 1] == str(32 * 512) and batched[batched.index("-npl") + 1] == "1,8,32"
    records = [
        {"n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 28554.1, "stddev_ts": 12.0},
        {"n_prompt": 0, "n_gen": 128, "n_depth": 4096, "avg_ts": 199.04, "stddev_ts": 0.5},
    ]
    rows = parse_bench(json.dumps(records))
    assert rows == [
        {"kind": "prefill", "tokens": 512, "depth": 0, "tok_s": 28554.1, "stddev": 12.0},
        {"kind": "decode", "tokens": 128, "depth": 4096, "tok_s": 199.04, "stddev": 0.5},
    ]
    line = (
        '{"n_kv_max": 16384, "n_batch": 2048, "n_ubatch": 512, "flash_attn": 1, "is_pp_shared": 0, '
        '"n_gpu_layers": 99, "n_threads": 8, "n_threads_batch": 8, "pp": 256, "tg": 256, "pl": 32, '
        '"n_kv": 16384, "t_pp": 0.5, "speed_pp": 16384.0, "t_tg": 1.86, "speed_tg": 4393.1, "t": 2.36, '
        '"speed": 6942.4}'
    )
    batched_rows = parse_batched("llama_model_loader: ...\n" + line + "\n\nllama_perf_context_print: ...")
    assert batched_rows == [
        {
            "streams": 32,
            "prompt": 256,
            "gen": 256,
            "decode_tok_s": 4393.1,
            "prefill_tok_s": 16384.0,
            "overall_tok_s": 6942.4,
        }
    ]
    text = markdown(
        {
            "device": "CPU",
            "commit": "abc",
            "source": "src",
            "gpu": False,
            "models": {"m": {"bench": rows, "batched": batched_rows}, "bad": {"error": "boom"}},
        }
    )
    assert "| decode 128 tokens at depth 4096 | 199.0 ± 0.5 |" in text and "error: boom" in text
