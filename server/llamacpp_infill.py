"""llama-server's `POST /infill`, the route code editors (llama.vim, llama.vscode) call: `input_prefix`,
`input_suffix`, `input_extra` (other files, `[{filename, text}]`, as repo-level context) and `prompt` (text
already typed in the hole) become the model's fill-in-the-middle prompt (server/fim.py). The reply is
llama-server's completion object (`content`, `stop`, `tokens_predicted`, `timings`, ...); with `stream`, SSE
events carry `content` deltas and the last one has `stop: true` and the totals."""

from __future__ import annotations

from typing import Any

from sanic import Blueprint, response

from .errors import ApiError, bad_request, error_body
from .fim import extra_files_field, fim_prompt_ids, require_fim, with_fim_stops
from .generation import HEARTBEAT, Generation, new_id
from .request_fields import get_bool, get_int, get_optional, get_str, json_body, openai_sampling_fields
from .sse import data, open_stream

blueprint = Blueprint("llamacpp_infill")

_NUMBER = (int, float)


def _sampling_body(body: dict) -> dict[str, Any]:
    """llama-server's sampling names -> OpenAI's (openai_sampling_fields reads those)."""
    out: dict[str, Any] = {}
    for key in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "seed", "stop"):
        if body.get(key) is not None:
            out[key] = body[key]
    if get_optional(body, "repeat_penalty", _NUMBER) is not None:
        out["repetition_penalty"] = body["repeat_penalty"]
    top_k = get_int(body, "top_k", None)
    if top_k is not None:
        out["top_k"] = max(top_k, 0)  # k <= 0 keeps the whole vocabulary
    n_predict = get_int(body, "n_predict", None)
    if n_predict is not None and n_predict > 0:  # -1: until a stop
        out["max_tokens"] = n_predict
    return out


def prepare_infill(service, body: dict) -> tuple[list[int], Any]:
    """(the FIM prompt's ids, the sampling params)."""
    service.require_ready()
    fim = require_fim(service, "input_prefix")
    prefix, suffix = get_str(body, "input_prefix", ""), get_str(body, "input_suffix", "")
    typed = get_str(body, "prompt", "")
    extra = extra_files_field(body.get("input_extra"))
    ids = fim_prompt_ids(service.tokenizer, fim, prefix, suffix, extra_files=extra, middle_start=typed)
    fields = openai_sampling_fields(with_fim_stops(_sampling_body(body), fim), max_tokens_keys=("max_tokens",))
    params = service.sampling_params(fields, rename={"max_tokens": "n_predict", "repetition_penalty": "repeat_penalty"})
    return ids, params


def _stop_type(finish_reason: str | None) -> str:
    return {"length": "limit", "stop": "eos"}.get(finish_reason or "", "none")


def _totals(service, usage, finish_reason: str | None) -> dict[str, Any]:
    predicted_ms = usage.decode_s * 1000 if usage else 0.0
    prompt_ms = usage.ttft_s * 1000 if usage else 0.0
    predicted = usage.completion_tokens if usage else 0
    prompt_n = usage.prompt_tokens if usage else 0
    return {
        "stop": True,
        "model": service.model_name,
        "stop_type": _stop_type(finish_reason),
        "tokens_predicted": predicted,
        "tokens_evaluated": prompt_n,
        "tokens_cached": usage.cached_tokens if usage else 0,
        "truncated": False,
        "timings": {
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "predicted_n": predicted,
            "predicted_ms": predicted_ms,
            "predicted_per_second": predicted / (predicted_ms / 1000) if predicted_ms > 0 else None,
        },
    }


@blueprint.post("/infill")
async def infill(request):
    service = request.app.ctx.service
    body = json_body(request)
    prompt_ids, params = prepare_infill(service, body)
    if params.n != 1:
        raise bad_request("one completion per infill request", "n")
    generation = Generation.start(
        service,
        prompt_ids,
        params,
        request_id=new_id("infill-"),
        max_tokens_param="n_predict",
        prompt_param="input_prefix",
    )
    if get_bool(body, "stream", False):
        return await _stream_infill(request, service, generation)
    result = await generation.collect()
    choice = result.choices[0]
    return response.json({"content": choice.text, **_totals(service, result.usage, choice.finish_reason)})


async def _stream_infill(request, service, generation: Generation):
    resp = await open_stream(request)
    finish_reason = None
    try:
        async for output in generation.events():
            if output is HEARTBEAT:
                await resp.send(generation.heartbeat_comment())
                continue
            if output.finish_reason is not None:
                finish_reason = output.finish_reason
            if output.text:
                await resp.send(data({"content": output.text, "stop": False}))
        await resp.send(data({"content": "", **_totals(service, generation.usage, finish_reason)}))
    except ApiError as error:
        await resp.send(data(error_body("openai", error)))
    await resp.eof()
    return resp
