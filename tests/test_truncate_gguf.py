"""tools/dev/truncate_gguf.py keeps a GGUF checkpoint's first layers and vocabulary ids byte for byte: cut to its
vocabulary alone, the model computes the whole model's logits for the kept ids."""

import numpy as np
import pytest
from gguf import GGUFReader

from ember.compiler.spec import spec_for_arch
from ember.runtime.execution.sequence_runner import SequenceRunner
from ember.runtime.loading.model import load_model
from ember.runtime.loading.synthetic_gguf import synthetic_gguf_checkpoint
from ember.tools.bench_models import SYNTHETIC_SHAPES
from ember.tools.dev.truncate_gguf import main, truncate_gguf
from ember.tools.write_gguf import write_gguf

VOCAB, KEPT_VOCAB = 4096, 1000


@pytest.fixture(scope="module")
def source(bpe_tokenizer, tmp_path_factory):
    """A 2-layer Qwen2 GGUF in the Q4_K_M layout, tied embeddings; a small vocabulary keeps gguf-py's reads fast."""
    arch, config = SYNTHETIC_SHAPES["qwen2-tiny"]
    checkpoint = synthetic_gguf_checkpoint(spec_for_arch(arch), {**config, "vocab_size": VOCAB}, scheme="q4_k_m")
    path = tmp_path_factory.mktemp("src") / "model.gguf"
    write_gguf(checkpoint, bpe_tokenizer, VOCAB, path)
    return path


def _tensors(path):
    return {t.name: (t.tensor_type, np.asarray(t.data)) for t in GGUFReader(path).tensors}


def test_kept_tensors_keep_their_bytes_and_the_metadata_follows(source, tmp_path):
    out = tmp_path / "cut.gguf"
    summary = truncate_gguf(source, out, layers=1, vocab=KEPT_VOCAB)
    assert summary["of_layers"] == 2 and summary["of_vocab"] == VOCAB and summary["bytes"] == out.stat().st_size
    full, cut = _tensors(source), _tensors(out)
    assert set(cut) == {name for name in full if not name.startswith("blk.1.")}
    for name, (kind, data) in cut.items():
        full_kind, full_data = full[name]
        expected = full_data[:KEPT_VOCAB] if name == "token_embd.weight" else full_data
        assert kind == full_kind and np.array_equal(data, expected), name
    fields = GGUFReader(out).fields
    assert fields["qwen2.block_count"].contents() == 1
    assert len(fields["tokenizer.ggml.tokens"].contents()) == KEPT_VOCAB
    assert fields["tokenizer.ggml.merges"].contents() == ["a b", "ab c"]  # every part of them is kept
    assert "tokenizer.ggml.eos_token_id" not in fields  # the source's eos id (VOCAB - 1) was cut away


def test_a_vocabulary_cut_alone_computes_the_whole_models_logits_for_the_kept_ids(source, tmp_path):
    out = tmp_path / "vocab-only.gguf"
    truncate_gguf(source, out, layers=2, vocab=KEPT_VOCAB)
    tokens = np.random.default_rng(3).integers(0, KEPT_VOCAB, 40).tolist()
    full = SequenceRunner(load_model(source), 40).prefill(tokens, all_logits=True)
    cut_model = load_model(out)
    assert int(cut_model.dims.vocab) == KEPT_VOCAB and int(cut_model.dims.layers) == 2
    cut = SequenceRunner(cut_model, 40).prefill(tokens, all_logits=True)
    # the same arithmetic; only the head matmul's width (and so XLA's blocking of its sums) differs
    np.testing.assert_allclose(cut, full[:, :KEPT_VOCAB], rtol=1e-5, atol=1e-5)


def test_asking_for_more_than_the_checkpoint_has_is_an_error(source, tmp_path, capsys):
    with pytest.raises(ValueError, match="has 2 layers"):
        truncate_gguf(source, tmp_path / "x.gguf", layers=3, vocab=10)
    assert main([str(source), "--layers", "1", "--vocab", "5000", "--out", str(tmp_path / "y.gguf")]) == 2
    assert "4096 ids" in capsys.readouterr().err
