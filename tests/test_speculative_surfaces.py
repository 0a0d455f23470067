"""Speculative decoding's surfaces: the flags and their EMBER_* mirrors, Predicted Outputs parsing, usage's
prediction counts, and the spec-decode metrics under vLLM's names."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest
from prometheus_client.core import CollectorRegistry
from prometheus_client.exposition import generate_latest

from ember.runtime.engine.streams import Usage
from ember.runtime.speculative.config import SpeculativeConfig, speculative_config
from ember.runtime.speculative.stats import AcceptanceStats
from ember.server.chat_request import prediction_ids
from ember.server.config import add_serve_arguments, config_from_args
from ember.server.errors import ApiError
from ember.server.metrics import _speculation_metrics
from ember.server.openai_chat import usage_dict
from ember.tools.cli import build_parser


def _serve(argv, environ):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return config_from_args(parser.parse_args(argv), environ)


def test_serve_flags_and_their_environment_mirrors(monkeypatch):
    assert _serve([], {}).speculative_config() is None
    config = _serve(["--speculative", "ngram"], {"EMBER_NUM_SPECULATIVE_TOKENS": "6"})
    assert config.speculative_config() == SpeculativeConfig("ngram", num_speculative_tokens=6)
    draft = _serve([], {"EMBER_SPECULATIVE": "draft"}).speculative_config()
    assert draft.method == "draft" and draft.draft_model == "qwen2.5-coder-0.5b-instruct"  # the default model's
    assert (
        _serve(["--speculative", "draft", "--draft-model", "/m.gguf"], {}).speculative_config().draft_model == "/m.gguf"
    )
    assert _serve(["--speculative", "ngram", "--deterministic"], {}).deterministic  # cpu: bucketed, allowed
    assert _serve(["--speculative", "ngram", "--deterministic", "--target", "h200"], {}).deterministic  # bucketed
    from ember.compiler import targets

    h200 = targets.get_target("h200")
    tiled = replace(h200, policy=h200.policy.overridden({"deterministic.bucketed": False}))
    monkeypatch.setattr(targets, "get_target", lambda name: tiled if name == "h200" else h200)
    with pytest.raises(SystemExit, match="fixed tiles"):  # a target whose deterministic steps run in fixed tiles
        _serve(["--speculative", "ngram", "--deterministic", "--target", "h200"], {})
    monkeypatch.undo()
    with pytest.raises(SystemExit, match="mtp is not available with --deterministic"):
        _serve(["--speculative", "mtp", "--deterministic"], {})
    with pytest.raises(SystemExit, match="unknown speculative method"):
        _serve(["--speculative", "medusa"], {})
    with pytest.raises(ValueError, match="needs --draft-model"):
        speculative_config("draft", None, 4, "/some/other.gguf")


def test_generate_and_bench_flags(monkeypatch):
    parser = build_parser()
    args = parser.parse_args(["generate", "--prompt", "x", "--speculative", "ngram", "--num-speculative-tokens", "3"])
    assert (args.speculative, args.num_speculative_tokens) == ("ngram", 3)
    monkeypatch.setenv("EMBER_SPECULATIVE", "draft")
    monkeypatch.setenv("EMBER_DRAFT_MODEL", "qwen2.5-coder-0.5b-instruct")
    args = build_parser().parse_args(["bench"])
    assert (args.speculative, args.draft_model, args.num_speculative_tokens) == (
        "draft",
        "qwen2.5-coder-0.5b-instruct",
        4,
    )


class _Service:
    def encode_chat(self, text):
        return [ord(c) for c in text]


def test_predicted_outputs_are_tokenized_or_refused():
    assert prediction_ids(_Service(), None) == ()
    assert prediction_ids(_Service(), {"type": "content", "content": "ab"}) == (97, 98)
    parts = {"type": "content", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert prediction_ids(_Service(), parts) == (97, 98)
    for bad in ({"type": "other", "content": "a"}, {"type": "content", "content": 3}, "text"):
        with pytest.raises(ApiError):
            prediction_ids(_Service(), bad)


def test_usage_carries_the_prediction_counts():
    usage = Usage(5, 7, 0, 0.0, 0.1, 0.2, 0.3, accepted_prediction_tokens=4, rejected_prediction_tokens=2)
    details = usage_dict(usage)["completion_tokens_details"]
    assert details == {"accepted_prediction_tokens": 4, "rejected_prediction_tokens": 2}


def test_spec_decode_metrics_use_vllm_names():
    stats = AcceptanceStats()
    stats.record(4, 2)
    stats.record(3, 3)
    registry = CollectorRegistry()

    class Collector:
        def collect(self):
            yield from _speculation_metrics(stats, ["m"])

    registry.register(Collector())
    text = generate_latest(registry).decode()
    assert 'ember:spec_decode_num_drafts_total{model_name="m"} 2.0' in text
    assert 'ember:spec_decode_num_draft_tokens_total{model_name="m"} 7.0' in text
    assert 'ember:spec_decode_num_accepted_tokens_total{model_name="m"} 5.0' in text
    assert 'ember:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="2"} 1.0' in text
