"""`ember serve` settings: flags win over EMBER_* variables, which win over the defaults."""

from __future__ import annotations

import argparse

import pytest

from ember.server.config import ServeConfig, add_serve_arguments, config_from_args


def _parse(argv, environ):
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return config_from_args(parser.parse_args(argv), environ)


def test_defaults_without_flags_or_environment():
    assert _parse([], {}) == ServeConfig()


def test_environment_fills_what_flags_leave_out():
    config = _parse(
        ["--port", "9000"],
        {
            "EMBER_PORT": "1",
            "EMBER_MAX_NUM_SEQS": "3",
            "EMBER_DETERMINISTIC": "1",
            "EMBER_CORS_ORIGINS": "https://a, https://b",
            "EMBER_API_KEY": "k",
            "EMBER_STREAM_USAGE": "0",
        },
    )
    assert config.port == 9000 and config.max_num_seqs == 3 and config.deterministic
    assert config.cors_origins == ("https://a", "https://b") and config.api_key == "k"
    assert config.stream_usage is False


def test_a_kernel_policy_file_comes_from_the_flag_or_its_mirror():
    assert _parse([], {"EMBER_KERNEL_POLICY": "a.json"}).kernel_policy == "a.json"
    assert _parse(["--kernel-policy", "b.json"], {"EMBER_KERNEL_POLICY": "a.json"}).kernel_policy == "b.json"
    assert _parse([], {}).kernel_policy is None


def test_switch_flags_turn_things_off_and_on():
    config = _parse(["--deterministic", "--no-stream-usage", "--no-precompile", "--no-background-compile"], {})
    assert config.deterministic and not config.stream_usage and not config.precompile
    assert not config.background_compile and _parse([], {}).background_compile
    assert not _parse([], {"EMBER_BACKGROUND_COMPILE": "0"}).background_compile


@pytest.mark.parametrize(
    ("name", "value"), [("EMBER_PORT", "http"), ("EMBER_MAX_NUM_SEQS", "0"), ("EMBER_DETERMINISTIC", "maybe")]
)
def test_bad_environment_values_exit_with_the_variable_named(name, value):
    with pytest.raises(SystemExit, match=name):
        _parse([], {name: value})
