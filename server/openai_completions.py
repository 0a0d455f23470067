"""OpenAI `POST /v1/completions`: a prompt (text or token ids) → text, with `echo`, integer `logprobs`
(0–20 alternatives per token), `suffix` (fill-in-the-middle: the prompt is the text before the hole, built
into the model's FIM prompt by server/fim.py), n choices, streaming SSE with a final usage chunk."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sanic import Blueprint, response

from ..runtime.sampling.params import SamplingParams
from .errors import ApiError, bad_request, error_body
from .fim import fim_prompt_ids, require_fim, with_fim_stops
from .generation import HEARTBEAT, Generation, new_id
from .openai_chat import Extra, fingerprint, include_usage, usage_dict
from .openai_logprobs import completion_logprobs
from .request_fields import get_bool, get_int, json_body, openai_sampling_fields, prompt_field
from .sse import DONE, data, open_stream

blueprint = Blueprint("openai_completions")


@dataclass
class CompletionRequest:
    prompt_ids: list[int]
    params: SamplingParams
    logprobs: int | None  # alternatives per token, None = no logprobs
    echo_text: str  # the prompt's text when `echo`, else ""
    stream: bool
    include_usage: bool


def prepare_completion(service, body: dict) -> CompletionRequest:
    service.require_ready()
    service.check_model(body.get("model"))
    best_of = get_int(body, "best_of", None, minimum=1)
    if best_of is not None and best_of != (body.get("n") or 1):
        raise bad_request("best_of is not supported (it must equal n)", "best_of")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request("one prompt per request (send several requests for a batch)", "prompt")
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise bad_request("suffix must be a string", "suffix")
    fields = openai_sampling_fields(body, max_tokens_keys=("max_tokens",))
    if suffix:
        fim = require_fim(service, "suffix")
        prompt = "" if prompt is None else prompt
        if not isinstance(prompt, str):
            raise bad_request("with suffix, prompt must be the text before the hole (a string)", "prompt")
        prompt_ids = fim_prompt_ids(service.tokenizer, fim, prompt, suffix)
        fields = with_fim_stops(fields, fim)
    else:
        prompt_ids = prompt_field(service, prompt, "prompt")
    logprobs = get_int(body, "logprobs", None, minimum=0, maximum=20)
    fields["logprobs"] = logprobs
    params = service.sampling_params(fields)
    echo = get_bool(body, "echo", False)
    echo_text = (
        "" if not echo else prompt if suffix else service.tokenizer.decode(prompt_ids, skip_special_tokens=False)
    )
    return CompletionRequest(
        prompt_ids, params, logprobs, echo_text, get_bool(body, "stream", False), include_usage(service, body)
    )


def start_completion(service, completion: CompletionRequest) -> tuple[Generation, str]:
    completion_id = new_id("cmpl-")
    return Generation.start(
        service, completion.prompt_ids, completion.params, request_id=completion_id, prompt_param="prompt"
    ), completion_id


@blueprint.post("/v1/completions")
async def completions(request):
    service = request.app.ctx.service
    completion = prepare_completion(service, json_body(request))
    generation, completion_id = start_completion(service, completion)
    if completion.stream:
        return await stream_completion(request, service, completion, generation, completion_id)
    return await complete_completion(service, completion, generation, completion_id)


async def complete_completion(
    service, completion: CompletionRequest, generation: Generation, completion_id: str, extra: Extra = None
):
    result = await generation.collect()
    echo = completion.echo_text
    choices = []
    for choice in result.choices:
        entry = {
            "index": choice.index,
            "text": echo + choice.text,
            "finish_reason": choice.finish_reason,
            "logprobs": completion_logprobs(service.tokenizer, choice.logprobs, completion.logprobs, len(echo))
            if completion.logprobs is not None
            else None,
        }
        if choice.stop_reason is not None:
            entry["stop_reason"] = choice.stop_reason
        choices.append(entry)
    payload = {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": service.model_name,
        "choices": choices,
        "usage": usage_dict(result.usage),
        "system_fingerprint": fingerprint(service),
    }
    return response.json({**payload, **(extra(choices[0]["finish_reason"]) if extra else {})})


async def stream_completion(
    request, service, completion: CompletionRequest, generation: Generation, completion_id: str, extra: Extra = None
):
    base = {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": service.model_name,
        "system_fingerprint": fingerprint(service),
    }
    resp = await open_stream(request)
    echo = completion.echo_text
    offsets = {i: len(echo) for i in range(generation.params.n)}
    if echo:
        for i in offsets:
            await resp.send(
                data({**base, "choices": [{"index": i, "text": echo, "logprobs": None, "finish_reason": None}]})
            )
    try:
        async for output in generation.events():
            if output is HEARTBEAT:
                await resp.send(generation.heartbeat_comment())
                continue
            lp = None
            if completion.logprobs is not None and output.logprobs:
                lp = completion_logprobs(
                    service.tokenizer, list(output.logprobs), completion.logprobs, offsets[output.index]
                )
            offsets[output.index] += len(output.text)
            if output.text or lp is not None or output.finish_reason is not None:
                last = output.usage is not None and not completion.include_usage
                more = extra(generation.endings.get(0, (None,))[0]) if extra and last else {}
                await resp.send(
                    data(
                        {
                            **base,
                            "choices": [
                                {
                                    "index": output.index,
                                    "text": output.text,
                                    "logprobs": lp,
                                    "finish_reason": output.finish_reason,
                                }
                            ],
                            **more,
                        }
                    )
                )
        if completion.include_usage and generation.usage is not None:
            more = extra(generation.endings.get(0, (None,))[0]) if extra else {}
            await resp.send(data({**base, "choices": [], "usage": usage_dict(generation.usage), **more}))
    except ApiError as error:
        await resp.send(data(error_body("openai", error)))
    await resp.send(DONE)
    await resp.eof()
    return resp
