"""Ollama's `POST /api/generate`: a prompt (with `system`) through the chat template — or, with `raw: true`
(or the trivial template `{{ .Prompt }}`), tokenized as it is, like `/v1/completions` — streamed as NDJSON
`response` deltas or answered as one object; the final reply carries `context` (prompt and output ids),
which a later request may send back to continue. With `suffix`, the prompt and suffix become the model's
fill-in-the-middle prompt (server/fim.py) instead of a chat turn."""

from __future__ import annotations

import time
from typing import Any

from sanic import response

from .chat_request import ChatRequest, prepare_chat
from .errors import ApiError, bad_request
from .fim import fim_prompt_ids, require_fim, with_fim_stops
from .generation import HEARTBEAT, Generation, new_id
from .ollama_models import check_ollama_model, requested_name
from .ollama_request import (
    created_at,
    done_fields,
    done_reason,
    fit_to_context,
    load_reply,
    openai_fields,
    split_deltas,
    template_kwargs,
)
from .openai_logprobs import chat_logprobs
from .request_fields import get_bool, get_str, json_body, openai_sampling_fields
from .sse import ndjson, open_ndjson

_TRIVIAL_TEMPLATES = frozenset({"{{ .Prompt }}", "{{.Prompt}}"})


def _generate_prompt(service, body: dict, model: str) -> tuple[ChatRequest | None, list[int], Any]:
    """(the chat request when templated, the prompt ids, the sampling params)."""
    if body.get("images"):
        raise bad_request("images are not supported: the served model reads text only", "images")
    template = get_str(body, "template", "")
    if template and template.strip() not in _TRIVIAL_TEMPLATES:
        raise bad_request(
            "template overrides are not supported: Ember renders the model's own chat template "
            "(send raw: true with a prompt formatted as you need)",
            "template",
        )
    raw = get_bool(body, "raw", False) or bool(template)
    prompt = get_str(body, "prompt", "")
    context = body.get("context") or []
    if context:
        context = service.check_token_ids(context, "context")
    fields = openai_fields(body)
    suffix = get_str(body, "suffix", "")
    if suffix:
        fim = require_fim(service, "suffix")
        ids = fim_prompt_ids(service.tokenizer, fim, prompt, suffix)
        return None, context + ids, _raw_params(service, with_fim_stops(fields, fim), body.get("format"))
    if raw:
        ids = (
            context + service.tokenizer.encode(prompt, add_special_tokens=False)
            if context
            else service.encode_text(prompt)
        )
        return None, ids, _raw_params(service, fields, body.get("format"))
    messages = [{"role": "user", "content": prompt}]
    system = get_str(body, "system", "")
    if system:
        messages.insert(0, {"role": "system", "content": system})
    chat_request = prepare_chat(
        service, {"messages": messages, **fields}, template_kwargs=template_kwargs(service, body, model)
    )
    chat_request.prompt_ids = context + chat_request.prompt_ids
    return chat_request, chat_request.prompt_ids, chat_request.params


def _raw_params(service, fields: dict, format_: Any):
    """Sampling for a raw prompt; `format` becomes a grammar directly (no chat template is involved)."""
    sampling = openai_sampling_fields(fields, max_tokens_keys=("max_tokens",))
    if fields.get("logprobs"):
        sampling["logprobs"] = fields.get("top_logprobs", 0)
    if format_ not in (None, ""):
        from .structured import StructuredOutputError, guided_from_ollama_format

        try:
            sampling["guided"] = guided_from_ollama_format(format_)
        except StructuredOutputError as error:
            raise bad_request(str(error), error.param) from error
    return service.sampling_params(sampling, rename={"max_tokens": "options.num_predict"})


async def generate(request):
    started = time.perf_counter()
    service = request.app.ctx.service
    service.require_ready()
    body = json_body(request)
    check_ollama_model(service, body.get("model"))
    model = requested_name(service, body.get("model"))
    if not body.get("prompt") and not body.get("suffix") and not body.get("images"):
        return load_reply(body, model, chat=False)
    chat_request, prompt_ids, params = _generate_prompt(service, body, model)
    params = fit_to_context(service, prompt_ids, params)
    generation = Generation.start(
        service,
        prompt_ids,
        params,
        request_id=new_id("ollama-gen-"),
        max_tokens_param="options.num_predict",
        prompt_param="prompt",
    )
    want_logprobs = params.logprobs is not None
    top = params.logprobs or 0
    base = {"model": model}
    if get_bool(body, "stream", True):
        return await _stream_generate(request, chat_request, generation, base, started, want_logprobs, top)
    result = await generation.collect()
    choice = result.choices[0]
    reply: dict[str, Any] = {**base, "created_at": created_at()}
    if chat_request is not None:
        parsed = chat_request.parse_output(choice.text, choice.finish_reason)
        reply["response"] = parsed.content or ""
        if parsed.reasoning:
            reply["thinking"] = parsed.reasoning
    else:
        reply["response"] = choice.text
    if want_logprobs:
        reply["logprobs"] = chat_logprobs(service.tokenizer, choice.logprobs, top)["content"]
    reply.update(done_fields(result.usage, done_reason(choice.finish_reason), started))
    reply["context"] = list(prompt_ids) + list(choice.token_ids)
    return response.json(reply)


async def _stream_generate(
    request,
    chat_request: ChatRequest | None,
    generation: Generation,
    base: dict,
    started: float,
    want_logprobs: bool,
    top: int,
):
    service = request.app.ctx.service
    resp = await open_ndjson(request)
    parser = chat_request.new_stream_parser() if chat_request is not None else None
    token_ids: list[int] = []
    finish_reason = None
    try:
        async for output in generation.events():
            if output is HEARTBEAT:
                await resp.send(ndjson({**base, "created_at": created_at(), "response": "", "done": False}))
                continue
            token_ids.extend(output.token_ids)
            if parser is not None:
                deltas = parser.feed(output.text) if output.text else []
                if output.finish_reason is not None:
                    deltas += parser.finish(output.finish_reason)
                content, thinking = split_deltas(deltas)
            else:
                content, thinking = output.text, ""
            if output.finish_reason is not None:
                finish_reason = output.finish_reason
            chunk: dict[str, Any] = {**base, "created_at": created_at(), "response": content, "done": False}
            if thinking:
                chunk["thinking"] = thinking
            if want_logprobs and output.logprobs:
                chunk["logprobs"] = chat_logprobs(service.tokenizer, list(output.logprobs), top)["content"]
            if content or thinking or "logprobs" in chunk:
                await resp.send(ndjson(chunk))
        final = {**base, "created_at": created_at(), "response": ""}
        final.update(done_fields(generation.usage, done_reason(finish_reason), started))
        final["context"] = list(generation.prompt_ids) + token_ids
        await resp.send(ndjson(final))
    except ApiError as error:
        await resp.send(ndjson({"error": error.message}))
    await resp.eof()
    return resp
