"""Ember's own routes: health, info, capacity, tokenize/detokenize, score, metrics, and `/v1/models`."""

from __future__ import annotations

from sanic import Blueprint, response

from .chat_request import render_chat_prompt
from .errors import ApiError, bad_request
from .generation import Generation, new_id
from .metrics import CONTENT_TYPE
from .openai_logprobs import token_text
from .openapi import openapi_document
from .request_fields import get_bool, get_int, get_optional, json_body, logit_bias_field, prompt_field

blueprint = Blueprint("ember")


@blueprint.get("/health")
async def health(request):
    service = request.app.ctx.service
    if service.is_ready:
        return response.json({"status": "ok", "model": service.model_name})
    body = {"status": service.state}
    if service.load_error:
        body["error"] = service.load_error
    elif service.engine_failure:
        body.update(status="failed", error=service.failure_line())
    return response.json(body, status=503)


@blueprint.get("/v1/info")
async def info(request):
    service = request.app.ctx.service
    service.require_ready()
    model = service.model
    return response.json(
        {
            "model": service.model_name,
            "architecture": model.spec.arch,
            "max_context_length": service.context_length,
            "max_output_tokens": min(
                service.context_length - 1, service.config.max_output_tokens or service.context_length
            ),
            "vocab_size": service.vocab_size,
            "target": service.config.target,
            "deterministic": service.engine.config.deterministic,
            "max_num_seqs": service.engine.config.max_num_seqs,
            "kv_block_size": service.engine.config.block_size,
            "dtype": str(model.dtype),
            # the devices the model is spread over (tensor_parallel 1: one device)
            "mesh": model.mesh.to_dict(),
            # bytes of the weights on the device vs the checkpoint's tensors as stored (ratio: device / checkpoint)
            "weight_bytes": service.weight_bytes.as_dict() if service.weight_bytes else None,
        }
    )


@blueprint.get("/v1/capacity")
async def capacity(request):
    service = request.app.ctx.service
    engine = service.require_ready()
    snap = engine.snapshot()
    # prompts still being read: how far each prefill got
    prefilling = [
        {"id": rid, "processed": done, "total": total} for rid, (done, total) in engine.prefill_progress().items()
    ]
    return response.json(
        {
            "prefilling": prefilling,
            "active": snap["running"],
            "waiting": snap["waiting"],
            "free_kv_blocks": snap["free_kv_blocks"],
            "total_kv_blocks": snap["total_kv_blocks"],
            "accepting": bool(snap["accepting"]) and service.is_ready,
        }
    )


@blueprint.get("/v1/models")
async def models(request):
    service = request.app.ctx.service
    service.require_ready()
    return response.json({"object": "list", "data": [model_card(service)]})


@blueprint.get("/v1/models/<name:path>")
async def model(request, name: str):
    service = request.app.ctx.service
    service.require_ready()
    service.check_model(name)
    return response.json(model_card(service))


def model_card(service) -> dict:
    return {
        "id": service.model_name,
        "object": "model",
        "created": service.created,
        "owned_by": "ember",
        "max_model_len": service.context_length,
        "context_length": service.context_length,
    }


@blueprint.post("/v1/tokenize")
async def tokenize(request):
    service = request.app.ctx.service
    service.require_ready()
    body = json_body(request)
    service.check_model(body.get("model"))
    if "messages" in body:
        ids = service.encode_chat(render_chat_prompt(service, body)[0])
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise bad_request("prompt must be a string (or send messages)", "prompt")
        ids = service.tokenizer.encode(prompt, add_special_tokens=get_bool(body, "add_special_tokens", True))
    out = {"tokens": ids, "count": len(ids), "max_model_len": service.context_length}
    if get_bool(body, "return_token_strs", False):
        out["token_strs"] = [service.tokenizer.id_to_token(i) for i in ids]
    return response.json(out)


@blueprint.post("/v1/detokenize")
async def detokenize(request):
    service = request.app.ctx.service
    service.require_ready()
    body = json_body(request)
    service.check_model(body.get("model"))
    ids = service.check_token_ids(body.get("tokens"), "tokens")
    return response.json({"prompt": service.tokenizer.decode(ids, skip_special_tokens=False)})


@blueprint.post("/v1/score")
async def score(request):
    """Teacher-forced logprobs of `completion` after `prompt` (or chat `messages`): each token's logprob
    is what generation reports at that position (same processing, same plan; bit-equal in deterministic
    mode), from one forced decode per completion token."""
    service = request.app.ctx.service
    service.require_ready()
    body = json_body(request)
    service.check_model(body.get("model"))
    if "messages" in body:
        prompt_ids = service.encode_chat(render_chat_prompt(service, body)[0])
    else:
        prompt_ids = prompt_field(service, body.get("prompt"), "prompt")
    completion = body.get("completion")
    if isinstance(completion, str) and completion:
        forced = service.tokenizer.encode(completion, add_special_tokens=False)
    else:
        forced = service.check_token_ids(completion, "completion")
    top = get_int(body, "top_logprobs", 0, minimum=0, maximum=20)
    params = service.sampling_params(
        {
            "temperature": 0.0,
            "logprobs": top,
            "max_tokens": len(forced),
            "forced_token_ids": tuple(forced),
            "ignore_eos": True,
            "repetition_penalty": get_optional(body, "repetition_penalty", (int, float)),
            "presence_penalty": get_optional(body, "presence_penalty", (int, float)),
            "frequency_penalty": get_optional(body, "frequency_penalty", (int, float)),
            "logit_bias": logit_bias_field(body),
            "skip_special_tokens": False,
        }
    )
    generation = Generation.start(
        service, prompt_ids, params, request_id=new_id("score-"), max_tokens_param="completion", prompt_param="prompt"
    )
    result = await generation.collect()
    entries = result.choices[0].logprobs
    if len(entries) != len(forced):
        raise ApiError(500, f"scoring returned {len(entries)} of {len(forced)} positions")
    tokens = [
        {
            "token_id": e.token_id,
            "token": token_text(service.tokenizer, e.token_id),
            "logprob": _json_logprob(e.logprob),
            "top_logprobs": [
                {"token_id": i, "token": token_text(service.tokenizer, i), "logprob": _json_logprob(lp)}
                for i, lp in e.top
            ],
        }
        for e in entries
    ]
    return response.json(
        {
            "object": "score",
            "model": service.model_name,
            "tokens": tokens,
            "total_logprob": sum(t["logprob"] for t in tokens),
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(forced)},
        }
    )


def _json_logprob(value: float) -> float:
    # JSON has no -inf (nor NaN): an impossible token (e.g. under an extreme repetition_penalty) reports
    # -9999.0, as the OpenAI logprob shapes do (openai_logprobs.py)
    return value if value > -1e30 else -9999.0


@blueprint.get("/metrics")
async def metrics(request):
    return response.raw(request.app.ctx.service.metrics.render(), content_type=CONTENT_TYPE)


@blueprint.get("/openapi.json")
async def openapi(request):
    return response.json(openapi_document(request.app.ctx.service))
