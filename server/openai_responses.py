"""OpenAI `POST /v1/responses` (the Responses API): the request becomes an OpenAI chat body
(openai_responses_input.py) and runs through the one chat path; its reply becomes output items — a
reasoning item, the assistant message, function_call items — as one response object or as the semantic
event stream (openai_responses_output.py).

With `store` (the default) a finished response is kept in the bounded, per-API-key store
(response_store.py): `previous_response_id` continues its conversation, `GET /v1/responses/{id}` returns
it and `DELETE` forgets it. status is "completed", or "incomplete" with
`incomplete_details.reason = "max_output_tokens"` when the reply was cut at the token limit.
"""

from __future__ import annotations

import time

from sanic import Blueprint, response

from .chat_request import ChatRequest, prepare_chat
from .errors import ApiError, bad_request, error_body
from .generation import HEARTBEAT, Generation, new_id
from .openai_responses_input import ResponsesRequest, parse_responses_request, remap_error
from .openai_responses_output import (
    INCOMPLETE_REASONS,
    ResponseEventWriter,
    output_items,
    response_object,
    usage_object,
)
from .request_fields import json_body
from .response_store import StoredResponse, input_items, owner_of, store_of
from .sse import event, open_stream

blueprint = Blueprint("openai_responses")


@blueprint.post("/v1/responses")
async def create_response(request):
    service = request.app.ctx.service
    service.require_ready()
    body = json_body(request)
    service.check_model(body.get("model"))
    owner, store = owner_of(request), store_of(request.app)
    previous = _previous(store, owner, body.get("previous_response_id"))
    parsed = parse_responses_request(body, previous.items if previous else None)
    try:
        chat = prepare_chat(service, parsed.chat_body)
        response_id = new_id("resp_")
        generation = Generation.start(
            service,
            chat.prompt_ids,
            chat.params,
            request_id=response_id,
            max_tokens_param="max_completion_tokens",
            prompt_param="messages",
        )
    except ApiError as error:
        raise remap_error(error, parsed) from None
    made = _Made(service, parsed, chat, response_id)
    made.history = (previous.items if previous else []) + input_items(body["input"])
    made.keep = (
        (lambda final: store.put(owner, final, made.history + final["output"])) if parsed.echo["store"] else None
    )
    if parsed.stream:
        return await _stream(request, made, generation)
    result = await generation.collect()
    choice = result.choices[0]
    reply = chat.parse_output(choice.text, choice.finish_reason)
    status = _status(choice.finish_reason)
    usage = usage_object(result.usage, made.token_count(reply.reasoning))
    final = made.response(status, output_items(reply, status), usage, choice.finish_reason)
    if made.keep:
        made.keep(final)
    return response.json(final)


def _previous(store, owner: str, response_id) -> StoredResponse | None:
    if response_id is None:
        return None
    if not isinstance(response_id, str):
        raise bad_request("previous_response_id must be a string", "previous_response_id")
    stored = store.get(owner, response_id)
    if stored is None:
        raise ApiError(
            400,
            f"previous response '{response_id}' not found (it was not stored, was evicted, or belongs to another key)",
            "previous_response_id",
            code="previous_response_not_found",
        )
    return stored


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"no stored response '{response_id}'", "response_id", code="not_found")


@blueprint.get("/v1/responses/<response_id:str>")
async def get_response(request, response_id: str):
    stored = store_of(request.app).get(owner_of(request), response_id)
    if stored is None:
        raise _not_found(response_id)
    return response.json(stored.response)


@blueprint.delete("/v1/responses/<response_id:str>")
async def delete_response(request, response_id: str):
    if not store_of(request.app).delete(owner_of(request), response_id):
        raise _not_found(response_id)
    return response.json({"id": response_id, "object": "response.deleted", "deleted": True})


class _Made:
    """What every response object of one request shares."""

    def __init__(self, service, parsed: ResponsesRequest, chat: ChatRequest, response_id: str):
        self.service, self.parsed, self.chat, self.id = service, parsed, chat, response_id
        self.created_at = int(time.time())
        self.history: list[dict] = []  # the conversation before this response's output, as items
        self.keep = None  # stores the final response object, when `store`

    def response(
        self,
        status: str,
        output: list[dict],
        usage: dict | None = None,
        finish_reason: str | None = None,
        error: dict | None = None,
    ) -> dict:
        reason = INCOMPLETE_REASONS.get(finish_reason or "") if status == "incomplete" else None
        return response_object(
            self.id,
            self.created_at,
            self.service.model_name,
            self.parsed.echo,
            self.chat.params,
            status=status,
            output=output,
            usage=usage,
            incomplete_reason=reason,
            error=error,
        )

    def token_count(self, text: str | None) -> int:
        return len(self.service.tokenizer.encode(text, add_special_tokens=False)) if text else 0


def _status(finish_reason: str | None) -> str:
    """Cut at the token limit is incomplete, even after complete calls: what followed them was cut."""
    return "incomplete" if finish_reason in INCOMPLETE_REASONS else "completed"


async def _stream(request, made: _Made, generation: Generation):
    writer = ResponseEventWriter()
    resp = await open_stream(request)

    async def send(events) -> None:
        for kind, payload in events:
            await resp.send(event(kind, payload))

    await send(
        [
            writer.lifecycle("response.created", made.response("in_progress", [])),
            writer.lifecycle("response.in_progress", made.response("in_progress", [])),
        ]
    )
    parser = made.chat.new_stream_parser()
    try:
        async for output in generation.events():
            if output is HEARTBEAT:
                await resp.send(generation.heartbeat_comment())
                continue
            deltas = parser.feed(output.text) if output.text else []
            if output.finish_reason is not None:
                deltas += parser.finish(output.finish_reason)
            for delta in deltas:
                await send(writer.feed(delta))
            if output.finish_reason is not None:
                status = _status(output.finish_reason)
                await send(writer.finish(status))
                usage = usage_object(generation.usage, made.token_count(writer.reasoning_text))
                final = made.response(status, writer.output, usage, output.finish_reason)
                if made.keep:
                    made.keep(final)
                await send([writer.lifecycle(f"response.{status}", final)])
    except ApiError as error:  # headers are out: the error travels as events
        body = error_body("openai", error)["error"]
        await send(
            [
                writer.event("error", code=body["code"], message=body["message"], param=body["param"]),
                writer.lifecycle(
                    "response.failed",
                    made.response("failed", writer.output, error={"code": "server_error", "message": error.message}),
                ),
            ]
        )
    await resp.eof()
    return resp
