"""`GET /openapi.json` and a schemathesis run against the live server from it: requests generated from
the document (valid ones, and invalid ones for the negative phase) must never get a 5xx, and every
answer must have a documented status, content type and body shape.

The document states the server's real bounds (max_tokens up to the context). So that fuzzing stays
fast on CPU, `cheap` shrinks what each generated request asks of the model (at most
FUZZ_MAX_TOKENS new tokens, a short scored completion) and turns streaming off; everything else is
sent as generated.
"""

from __future__ import annotations

import json
import os

import httpx
import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core import NOT_SET
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

FUZZ_MAX_TOKENS = 6
FUZZ_MAX_N = 2
MAX_EXAMPLES = int(os.environ.get("EMBER_FUZZ_EXAMPLES", "20"))  # per operation and mode; raise it locally
OPENAI_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/models",
    "/v1/tokenize",
    "/v1/detokenize",
    "/v1/score",
)
_TOKEN_FIELDS = {
    "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
}


# (path, method) of each fuzzed operation: the OpenAI routes and Ember's tokenize/detokenize/score
OPERATIONS = [
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/v1/responses", "POST"),
    ("/v1/responses/{response_id}", "GET"),
    ("/v1/models", "GET"),
    ("/v1/models/{model}", "GET"),
    ("/v1/tokenize", "POST"),
    ("/v1/detokenize", "POST"),
    ("/v1/score", "POST"),
]
# negative (schema-violating) requests for the operations with a body; the GETs have nothing to break
RUNS = [
    (path, method, mode)
    for path, method in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if method == "POST" or mode == "positive"
]
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def cheap(path: str, body):
    """Keep a generated request cheap for a CPU model: few new tokens, few choices, no stream."""
    if not isinstance(body, dict):
        return body
    body = dict(body)
    keys = _TOKEN_FIELDS.get(path, ())
    for key in keys:
        if isinstance(body.get(key), int) and not isinstance(body[key], bool) and body[key] > FUZZ_MAX_TOKENS:
            body[key] = FUZZ_MAX_TOKENS
    if keys and not any(key in body for key in keys):
        body[keys[-1]] = FUZZ_MAX_TOKENS  # absent means "until the context is full"
    if isinstance(body.get("n"), int) and not isinstance(body["n"], bool) and body["n"] > FUZZ_MAX_N:
        body["n"] = FUZZ_MAX_N
        if "best_of" in body:
            body["best_of"] = FUZZ_MAX_N
    if body.get("stream") is True:
        body["stream"] = False
    completion = body.get("completion") if path == "/v1/score" else None
    if isinstance(completion, (str, list)) and len(completion) > 8:
        body["completion"] = completion[:8]
    return body


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


@pytest.mark.parametrize(("path", "method", "mode"), RUNS, ids=[f"{m} {p} {mode}" for p, m, mode in RUNS])
def test_generated_requests_never_get_a_server_error(api_schema, path, method, mode):
    """schemathesis' Python API with a plain hypothesis test per operation and mode (its pytest plugin's
    lazy fixture loader does not run on pytest 9)."""
    operation = api_schema[path][method]
    sent = []

    @given(case=operation.as_strategy(mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],
    )
    def run(case):
        if case.body is not NOT_SET:
            case.body = cheap(path, case.body)
        sent.append(case.call_and_validate(checks=CHECKS, timeout=120).status_code)

    run()
    print(f"{method} {path} {mode}: {len(sent)} requests, statuses {sorted(set(sent))}")
    assert sent


def test_openapi_document_describes_the_openai_routes(server):
    doc = httpx.get(server.url + "/openapi.json", timeout=30).json()
    assert doc["openapi"].startswith("3.1")
    for path in OPENAI_ROUTES:
        assert path in doc["paths"], path
    model = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
    schemas = doc["components"]["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest", "ResponseRequest"):
        assert schemas[name]["properties"]["model"]["enum"] == [model]
    for body in schemas.values():
        jsonschema.Draft202012Validator.check_schema(body)
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    for status in ("400", "401", "404", "413", "429", "503", "504"):
        assert chat[status]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    info = httpx.get(server.url + "/v1/info", timeout=30).json()
    limit = schemas["ChatCompletionRequest"]["properties"]["max_tokens"]["maximum"]
    assert limit == info["max_context_length"] - 1


def test_error_answers_match_the_documented_error_shape(server):
    doc = httpx.get(server.url + "/openapi.json", timeout=30).json()
    error_schema = doc["components"]["schemas"]["Error"]
    for body in (
        {"messages": []},
        {"messages": [{"role": "user", "content": "hi"}], "model": "nope"},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6},
    ):
        answer = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code in (400, 404)
        jsonschema.validate(answer.json(), error_schema)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/tokenize"])
@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,  # nested past Python's recursion limit (was a 500: RecursionError)
        b'{"prompt": "\\ud800", "input": "\\ud800", "messages": [{"role": "user", "content": "a\\udc00b"}]}',  # lone
        # surrogates cannot be tokenized (was a 500: TypeError from the tokenizer)
    ],
    ids=["deep-nesting", "lone-surrogate"],
)
def test_bodies_the_fuzzer_rarely_builds_are_400(server, path, body):
    answer = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request_error"


def test_paired_surrogate_escapes_are_text(server):
    answer = httpx.post(
        server.url + "/v1/tokenize",
        content=b'{"prompt": "\\ud83d\\ude00"}',
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert answer.status_code == 200 and answer.json()["count"] >= 1


def _strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_score_of_an_impossible_token_is_still_json(server):
    """Found by the fuzzer: under a huge repetition_penalty a repeated token's logprob is -inf, which
    went out as `-Infinity` (not JSON); it is reported as -9999.0, as the OpenAI logprob shapes do."""
    body = {"prompt": "the cat the cat", "completion": " the cat", "repetition_penalty": 1e300, "top_logprobs": 2}
    answer = httpx.post(server.url + "/v1/score", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    score = _strict_json(answer.text)
    assert all(isinstance(t["logprob"], float) for t in score["tokens"])
    assert score["total_logprob"] == pytest.approx(sum(t["logprob"] for t in score["tokens"]))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/tokenize"])
def test_a_tool_message_with_an_object_call_id_is_400(server, path):
    """Found by the fuzzer: a tool message's tool_call_id is looked up by the tool-turn translation; an
    object there was a 500 (TypeError: unhashable type)."""
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "tool", "content": "22 C", "tool_call_id": {"id": "call_1"}},
        ],
        "max_tokens": 2,
    }
    answer = httpx.post(server.url + path, json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "messages[1].tool_call_id"


def test_huge_temperature_under_a_grammar_is_not_a_500(server):
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_object"},
        "max_tokens": 6,
        "temperature": 1e308,
        "seed": 0,
    }
    answer = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code < 500, answer.text
