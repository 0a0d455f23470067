"""OutputProcessor: sampled ids -> streamed text deltas, stop ids, stop strings, min/max tokens.

Fast tests use the tiny synthetic GGUF vocabularies of tests/fixtures/tokenizer/synthetic.json; the
`real_model` ones use the tokenizers of the two real GGUF files. The property tests check the whole
contract against a reference computed from `tokenizer.decode` of the full id sequence.
"""

from __future__ import annotations

import json
import re
from functools import cache
from itertools import accumulate
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.runtime.engine.output_processor import Delta, OutputProcessor
from ember.runtime.loading.text.tokenizer import Tokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "tokenizer"
REPLACEMENT_CHAR = "\ufffd"
SYNTHETIC = ("gpt2_qwen2", "gemma3_spm", "llama_spm")
BYTE_TOKEN = re.compile(r"<0x([0-9A-F]{2})>")
MULTIBYTE_TEXTS = ("€", "🧑", "💻", "你", "é", "\u200d", "😀")


@cache
def synthetic(name: str) -> Tokenizer:
    case = json.loads((FIXTURES / "synthetic.json").read_text(encoding="utf-8"))["cases"][name]
    return Tokenizer.from_gguf_metadata(case["metadata"], f"<synthetic {name}>")


@cache
def real(path: Path) -> Tokenizer:
    from ember.runtime.loading.formats.gguf_reader import GGUFFile

    with GGUFFile(path, require_supported=False) as gguf:
        return Tokenizer.from_gguf_metadata(gguf.metadata, str(path))


def qwen() -> Tokenizer:  # the byte-level BPE vocabulary (Qwen2-style), where each byte can be its own token
    return synthetic("gpt2_qwen2")


def processor(tokenizer: Tokenizer, **options) -> OutputProcessor:
    options.setdefault("max_tokens", 100)
    return OutputProcessor(tokenizer, options.pop("prompt_ids", ()), **options)


def drive(proc: OutputProcessor, ids, logprobs=None) -> list[Delta]:
    """Push ids until the processor finishes; end with finish("length") if the ids run out first."""
    deltas = []
    for index, token in enumerate(ids):
        deltas.append(proc.push(token, None if logprobs is None else logprobs[index]))
        if proc.done:
            return deltas
    return [*deltas, proc.finish("length")]


def joined(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


def ids_of(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


# ---- stop strings ------------------------------------------------------------------------------


def test_plain_output_streams_each_token_at_once_and_ends_with_length():
    tok = qwen()
    proc = processor(tok, max_tokens=2)
    first, second = (proc.push(i) for i in ids_of(tok, "hello world"))
    assert first == Delta("hello", (260,), None, None, None)
    assert second == Delta(" world", (265,), None, "length", None)
    assert proc.done and proc.text == "hello world" and proc.output_token_ids == (260, 265)
    with pytest.raises(RuntimeError, match="finished"):
        proc.push(260)


def test_a_possible_stop_string_start_is_held_until_disambiguated():
    tok = qwen()
    proc = processor(tok, stop=["\n\n"])
    newline, a, b = tok.token_to_id("Ċ"), tok.token_to_id("a"), tok.token_to_id("b")
    assert proc.push(a).text == "a"
    assert proc.push(newline) == Delta("", (), None, None, None)  # the id waits with its text
    assert proc.push(b) == Delta("\nb", (newline, b), None, None, None)
    proc.push(newline)
    stopped = proc.push(newline)
    assert (stopped.text, stopped.finish_reason, stopped.stop_reason) == ("", "stop", "\n\n")
    assert stopped.token_ids == (newline, newline)  # generated ids all go out at the end
    assert proc.text == "a\nb"


def test_stop_string_spanning_tokens_and_starting_inside_one():
    tok = qwen()
    # "lo wor" starts inside "hello" and ends inside " world"
    deltas = drive(processor(tok, stop=["lo wor"]), ids_of(tok, "hello world hello"))
    assert [d.text for d in deltas] == ["hel", ""]
    assert (deltas[-1].finish_reason, deltas[-1].stop_reason, deltas[-1].token_ids) == ("stop", "lo wor", (260, 265))


@pytest.mark.parametrize(
    ("stops", "text", "reason"),
    [
        (["hello there", "llo"], "he", "llo"),
        (["llo", "hello there"], "he", "llo"),  # completed first wins
        (["o w", "lo w"], "hel", "lo w"),
        (["lo w", "o w"], "hel", "lo w"),  # completed together: starting first
        (["ll", "xyz"], "he", "ll"),  # and the text after it inside the same token is dropped
        (["o world", "wo"], "hello ", "wo"),  # both in one token: "wo" ends first though "o world" starts first
    ],
)
def test_the_stop_string_completed_first_wins(stops, text, reason):
    deltas = drive(processor(qwen(), stop=stops), ids_of(qwen(), "hello world"))
    assert (joined(deltas), deltas[-1].finish_reason, deltas[-1].stop_reason) == (text, "stop", reason)


def test_include_stop_str_in_output_streams_without_holding_and_cuts_after_the_stop():
    tok = qwen()
    proc = processor(tok, stop=["o wo", "xyz"], include_stop_str_in_output=True)
    assert proc.push(tok.token_to_id("hello")).text == "hello"  # nothing held: the stop string would go out anyway
    last = proc.push(tok.token_to_id("Ġworld"))
    assert (last.text, last.finish_reason, last.stop_reason) == (" wo", "stop", "o wo")
    assert proc.text == "hello wo"


def test_multibyte_stop_string_split_over_byte_tokens():
    tok = qwen()
    ids = ids_of(tok, "a€b")  # "€" is three byte-level tokens
    deltas = drive(processor(tok, stop=["€"]), ids)
    assert joined(deltas) == "a" and deltas[-1].stop_reason == "€"
    assert deltas[-1].token_ids == tuple(ids[1:4])  # "b" was never pushed


# ---- stop ids, eos, min_tokens, max_tokens -----------------------------------------------------


def test_eos_stops_without_its_text_and_ignore_eos_keeps_going():
    tok = qwen()
    eos = tok.eos_token_id
    ids = [*ids_of(tok, "hello"), eos, *ids_of(tok, " world")]
    stopped = drive(processor(tok, eos_token_ids=tok.eos_token_ids, skip_special_tokens=False), ids)
    assert joined(stopped) == "hello"
    assert (stopped[-1].finish_reason, stopped[-1].stop_reason, stopped[-1].token_ids) == ("stop", None, (eos,))
    deltas = drive(processor(tok, eos_token_ids=tok.eos_token_ids, ignore_eos=True, skip_special_tokens=False), ids)
    assert joined(deltas) == "hello<|im_end|> world" and deltas[-1].finish_reason == "length"


def test_stop_token_ids_stop_even_with_ignore_eos_and_report_the_id():
    tok = qwen()
    stop_id = tok.token_to_id("Ġworld")
    proc = processor(tok, stop_token_ids=[stop_id], eos_token_ids=tok.eos_token_ids, ignore_eos=True)
    deltas = drive(proc, ids_of(tok, "hello world hello"))
    assert (joined(deltas), deltas[-1].finish_reason, deltas[-1].stop_reason) == ("hello", "stop", stop_id)
    assert proc.output_token_ids == (tok.token_to_id("hello"), stop_id)


def test_min_tokens_suppresses_stop_ids_and_defers_stop_strings():
    tok = qwen()
    stop_id = tok.token_to_id("!")
    proc = processor(tok, stop=["l"], stop_token_ids=[stop_id], eos_token_ids=tok.eos_token_ids, min_tokens=2)
    assert proc.suppressed_token_ids() == (stop_id, *tok.eos_token_ids)
    first = proc.push(tok.token_to_id("hello"))  # "l" inside the first min_tokens tokens does not stop
    assert (first.text, first.finish_reason) == ("hello", None)
    assert proc.suppressed_token_ids() == (stop_id, *tok.eos_token_ids)
    second = proc.push(stop_id)  # not suppressed by the sampler here: it does not stop before min_tokens
    assert (second.text, second.finish_reason) == ("!", None)
    assert proc.suppressed_token_ids() == ()
    third = proc.push(tok.token_to_id("ll"))
    assert (third.text, third.finish_reason, third.stop_reason) == ("", "stop", "l")
    ignoring_eos = processor(tok, stop_token_ids=[7], eos_token_ids=[9], ignore_eos=True, min_tokens=1)
    assert ignoring_eos.suppressed_token_ids() == (7,)
    assert processor(tok, eos_token_ids=[9]).suppressed_token_ids() == ()
    proc = processor(tok, eos_token_ids=tok.eos_token_ids, min_tokens=1)
    proc.push(tok.token_to_id("hello"))
    assert proc.push(tok.eos_token_id).finish_reason == "stop"  # token min_tokens + 1 may stop
    # A lone continuation byte: the detokenizer holds its U+FFFD until the stop token flushes it, but it is the
    # text of token 1, inside min_tokens, so it cannot end a stop string.
    proc = processor(tok, stop=[REPLACEMENT_CHAR], eos_token_ids=tok.eos_token_ids, min_tokens=1)
    assert proc.push(tok.token_to_id("Ģ")).text == ""  # byte 0x80
    last = proc.push(tok.eos_token_id)
    assert (last.text, last.finish_reason, last.stop_reason) == (REPLACEMENT_CHAR, "stop", None)


def test_max_tokens_flushes_held_text_and_a_stop_token_at_the_limit_still_stops():
    tok = qwen()
    proc = processor(tok, stop=["o w"], max_tokens=1)
    last = proc.push(tok.token_to_id("hello"))
    assert (last.text, last.finish_reason, last.token_ids) == ("hello", "length", (260,))
    proc = processor(tok, eos_token_ids=tok.eos_token_ids, max_tokens=1)
    assert proc.push(tok.eos_token_id).finish_reason == "stop"


def test_engine_side_finish_length_flushes_and_abort_emits_nothing_held():
    tok = qwen()
    for reason, text in (("length", "hello"), ("abort", ""), ("stop", "hello")):
        proc = processor(tok, stop=["o w"])
        assert proc.push(tok.token_to_id("hello")).text == "hell"
        end = proc.finish(reason)
        assert (end.text, end.finish_reason, end.token_ids) == (text[4:], reason, (260,))
        assert proc.text == "hell" + text[4:]
        with pytest.raises(RuntimeError):
            proc.finish(reason)
    with pytest.raises(ValueError, match="finish reason"):
        processor(tok).finish("error")


def test_logprobs_travel_with_their_token_ids():
    tok = qwen()
    ids = ids_of(tok, "a\nb")  # "a", "\n" held for stop "\nx", "b"
    deltas = drive(processor(tok, stop=["\nx"]), ids, logprobs=["lp-a", "lp-nl", "lp-b"])
    assert [(d.token_ids, d.logprobs) for d in deltas] == [
        ((ids[0],), ("lp-a",)),
        ((), None),
        ((ids[1], ids[2]), ("lp-nl", "lp-b")),
        ((), None),
    ]
    assert drive(processor(tok), ids)[0].logprobs is None


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"stop": [""]}, "non-empty"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ],
)
def test_bad_settings_are_rejected(options, problem):
    with pytest.raises(ValueError, match=problem):
        processor(qwen(), **options)


@pytest.mark.parametrize("name", SYNTHETIC)
def test_characters_split_over_byte_tokens_never_stream_a_replacement_char(name):
    tok = synthetic(name)
    text = "hello 你好 🧑\u200d💻 and € world"
    ids = ids_of(tok, text)
    deltas = drive(processor(tok), ids)
    assert joined(deltas) == tok.decode(ids, skip_special_tokens=True)
    assert not any(REPLACEMENT_CHAR in d.text for d in deltas)
    assert sum(not d.text for d in deltas) >= 3  # the emoji's bytes came as several tokens


# ---- the contract, as a property against decode() of the whole sequence ------------------------


def reference(
    tok: Tokenizer,
    ids,
    *,
    stop,
    stop_token_ids,
    eos_token_ids,
    ignore_eos,
    min_tokens,
    max_tokens,
    include_stop_str_in_output,
    skip_special_tokens,
):
    """(text, output ids, finish_reason, stop_reason, start of the stop string or None) computed from
    decode() of prefixes: what the processor must stream."""
    ids = list(ids[:max_tokens])
    stop_ids = set(stop_token_ids) | (set() if ignore_eos else set(eos_token_ids))
    stop_at = next((k for k, t in enumerate(ids) if t in stop_ids and k >= min_tokens), None)
    body = ids[:stop_at] if stop_at is not None else ids
    consumed = ids[: stop_at + 1] if stop_at is not None else ids
    text = tok.decode(body, skip_special_tokens)

    def seen(k: int) -> int:  # text the stream has after k ids (it holds back a trailing incomplete character)
        return len(tok.decode(body[:k], skip_special_tokens).rstrip(REPLACEMENT_CHAR))

    # Stop strings must end in the text of a token after min_tokens (the last token's text includes the flush).
    threshold = len(text) if min_tokens >= len(body) else seen(min_tokens)
    matches = []
    for s in stop:
        start = text.find(s, max(0, threshold - len(s) + 1))
        if start >= 0:
            matches.append((start + len(s), start, s))
    if matches:
        end, start, s = min(matches)
        k = next((k for k in range(1, len(body) + 1) if seen(k) >= end), None)
        out_ids = body[:k] if k is not None else consumed  # None: only the final flush completed it
        return text[: end if include_stop_str_in_output else start], out_ids, "stop", s, start
    if stop_at is not None:
        return text, consumed, "stop", ids[stop_at] if ids[stop_at] in stop_token_ids else None, None
    return text, consumed, "length", None, None


def check_against_reference(tok: Tokenizer, ids, data) -> None:
    decoded = tok.decode(ids, skip_special_tokens=True)
    substring = st.integers(0, max(len(decoded) - 1, 0)).flatmap(
        lambda i: st.integers(1, 6).map(lambda n: decoded[i : i + n])
    )
    stop = data.draw(
        st.lists(st.one_of(substring, st.text("lo \n!wé€", min_size=1, max_size=4)), max_size=3).map(
            lambda stops: [s for s in stops if s]
        ),
        label="stop",
    )
    options = dict(
        stop=stop,
        stop_token_ids=data.draw(st.lists(st.sampled_from(ids), max_size=1), label="stop ids"),
        eos_token_ids=tok.eos_token_ids,
        ignore_eos=data.draw(st.booleans(), label="ignore_eos"),
        max_tokens=data.draw(st.integers(1, len(ids) + 2), label="max_tokens"),
        include_stop_str_in_output=data.draw(st.booleans(), label="include"),
        skip_special_tokens=data.draw(st.booleans(), label="skip"),
    )
    options["min_tokens"] = data.draw(st.integers(0, min(3, options["max_tokens"])), label="min_tokens")
    text, out_ids, finish, stop_reason, stop_start = reference(tok, ids, **options)

    proc = OutputProcessor(tok, (), **options)
    deltas, emitted = [], ""
    for index, token in enumerate(ids):
        delta = proc.push(token, logprob=("lp", index))
        deltas.append(delta)
        emitted += delta.text
        if proc.done:
            break
        # Liveness: only a proper prefix of a stop string may be held back.
        seen = tok.decode(ids[: index + 1], options["skip_special_tokens"]).rstrip(REPLACEMENT_CHAR)
        assert seen.startswith(emitted)
        held = seen[len(emitted) :]
        assert not held or (
            not options["include_stop_str_in_output"] and any(s.startswith(held) and s != held for s in stop)
        ), (held, stop)
    if not proc.done:
        deltas.append(proc.finish("length"))
    assert joined(deltas) == text == proc.text
    assert tuple(t for d in deltas for t in d.token_ids) == proc.output_token_ids == tuple(out_ids)
    assert tuple(lp for d in deltas for lp in d.logprobs or ()) == tuple(("lp", i) for i in range(len(out_ids)))
    assert (deltas[-1].finish_reason, deltas[-1].stop_reason) == (finish, stop_reason)
    assert all(d.finish_reason is None for d in deltas[:-1])
    if stop_start is not None and not options["include_stop_str_in_output"]:  # no delta carried any of it
        assert all(emitted <= stop_start for emitted in accumulate(len(d.text) for d in deltas))


def test_skipped_special_token_keeps_the_space_of_the_next_word_in_llama_style_sentencepiece():
    tok = synthetic("llama_spm")
    ids = [tok.token_to_id("▁hello"), tok.token_to_id("</s>"), tok.token_to_id("▁world")]
    assert joined(drive(processor(tok, max_tokens=3), ids)) == tok.decode(ids, skip_special_tokens=True)


@cache
def byte_and_special_tokens(tok: Tokenizer) -> tuple[dict[int, int], frozenset[int]]:
    """SentencePiece `<0xXX>` byte tokens (id -> byte) and the special tokens (skipped by decode)."""
    byte_tokens = {
        i: int(match.group(1), 16)
        for i in range(min(tok.vocab_size, 600))
        if (match := BYTE_TOKEN.fullmatch(tok.id_to_token(i) or ""))
    }
    special = frozenset(i for i, t in tok.backend.get_added_tokens_decoder().items() if t.special)
    return byte_tokens, special


def byte_runs_hold_one_character(tok: Tokenizer, ids) -> bool:
    """HF's ByteFallback decodes a run of byte tokens that is not valid UTF-8 as one U+FFFD per byte, even
    the bytes of whole characters in the run, which a stream has sent already. A stop or max_tokens may cut
    a run anywhere, so compare only sequences whose runs (special tokens may vanish from inside one) hold
    at most one character."""
    byte_tokens, special = byte_and_special_tokens(tok)
    starts_in_run = 0
    for token in ids:
        if token in byte_tokens:
            starts_in_run += byte_tokens[token] & 0xC0 != 0x80  # not a continuation byte
            if starts_in_run > 1:
                return False
        elif token not in special:
            starts_in_run = 0
    return True


def token_sequences(tok: Tokenizer, max_size: int):
    """Random ids from the whole vocabulary; SentencePiece byte tokens only as the bytes of whole characters,
    one character to a run (see byte_runs_hold_one_character)."""
    byte_tokens, _ = byte_and_special_tokens(tok)
    single = st.integers(0, tok.vocab_size - 1).filter(lambda i: i not in byte_tokens).map(lambda i: [i])
    pieces = single
    if byte_tokens:
        pieces = st.one_of(single, st.sampled_from([ids_of(tok, c) for c in MULTIBYTE_TEXTS]))
    return (
        st.lists(pieces, min_size=1, max_size=max_size)
        .map(lambda p: sum(p, []))
        .filter(lambda ids: byte_runs_hold_one_character(tok, ids))
    )


def draw_ids(tok: Tokenizer, data, alphabet: str, max_tokens: int) -> list[int]:
    """Random ids from the vocabulary, or the ids of random text."""
    if data.draw(st.booleans(), label="natural text"):
        text = data.draw(
            st.text(alphabet, min_size=1, max_size=3 * max_tokens).filter(
                lambda t: byte_runs_hold_one_character(tok, ids_of(tok, t))
            ),
            label="text",
        )
        return ids_of(tok, text)
    return data.draw(token_sequences(tok, max_tokens), label="ids")


@pytest.mark.parametrize("name", SYNTHETIC)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_streamed_output_matches_decode_cut_at_the_stop(name, data):
    tok = synthetic(name)
    check_against_reference(tok, draw_ids(tok, data, "hello wrd,!t你好€🧑\n", 14), data)


@pytest.mark.real_model
@pytest.mark.parametrize("model", ["qwen", "gemma"])
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_real_vocabularies_stream_like_decode(model, request, data):
    tok = real(request.getfixturevalue(f"{model}_gguf"))
    check_against_reference(tok, draw_ids(tok, data, "abc xyz\n\t{}()你好世界🧑‍💻€é", 12), data)


@pytest.mark.real_model
@pytest.mark.parametrize("model", ["qwen", "gemma"])
def test_real_vocabularies_emoji_and_cjk_never_stream_a_replacement_char(model, request):
    tok = real(request.getfixturevalue(f"{model}_gguf"))
    text = "def f():\n    return '你好，世界' + '🧑\u200d💻👨\u200d👩\u200d👧' + 'ünïcödé €'\n\n"
    ids = ids_of(tok, text)
    deltas = drive(processor(tok, prompt_ids=ids_of(tok, "print"), max_tokens=len(ids)), ids)
    assert joined(deltas) == text and deltas[-1].finish_reason == "length"
    assert not any(REPLACEMENT_CHAR in d.text for d in deltas)
    deltas = drive(processor(tok, stop=["💻", "\n\n"], eos_token_ids=tok.eos_token_ids), ids)
    assert joined(deltas) == text[: text.index("💻")] and deltas[-1].stop_reason == "💻"
    assert not any(REPLACEMENT_CHAR in d.text for d in deltas)
