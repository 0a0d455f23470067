"""Loading streams: the host holds the checkpoint's tensors of a few parts (a layer, or a global weight) at a
time, never the whole model: every tensor read is placed on the device and dropped before more than
LOAD_WORKERS parts ahead are read (runtime/loading/weights.py, prefetch.py)."""

from __future__ import annotations

import weakref

from tiny_configs import TINY_LLAMA

from ember.compiler.spec import spec_for_arch
from ember.runtime.loading import weights as weights_module
from ember.runtime.loading.model import load_model
from ember.runtime.loading.synthetic_gguf import synthetic_gguf_checkpoint

CONFIG = {**TINY_LLAMA, "num_hidden_layers": 12, "tie_word_embeddings": False}


def test_the_host_never_holds_more_than_a_few_layers(monkeypatch):
    ckpt = synthetic_gguf_checkpoint(spec_for_arch("llama"), CONFIG, seed=4)
    live: dict[int, int] = {}  # id -> bytes of host tensors read and not yet freed
    peak, total = [0], [0]
    read = ckpt.load

    def tracked_load(name):
        array = read(name)
        key = id(array)
        live[key] = array.nbytes
        total[0] += array.nbytes
        weakref.finalize(array, live.pop, key, None)
        peak[0] = max(peak[0], sum(live.values()))
        return array

    monkeypatch.setattr(ckpt, "load", tracked_load)
    monkeypatch.setattr(weights_module, "LOAD_WORKERS", 1)
    load_model(ckpt, target="cpu")  # every tensor dequantized on the host, then placed
    layer_bytes = max(total[0] / CONFIG["num_hidden_layers"], 1)
    assert not live  # nothing read is still held by the loader
    assert total[0] > 10 * layer_bytes * 0.9  # the whole model went through the host...
    assert peak[0] <= 3.5 * layer_bytes, (peak[0], layer_bytes)  # ...a part or two at a time
