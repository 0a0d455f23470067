"""Errors in each protocol's own shape.

Handlers raise `ApiError`; the app's error handler renders it for the protocol the path belongs to:
OpenAI (and LM Studio, and Ember's own routes) `{"error": {"message", "type", "param", "code"}}`,
Anthropic `{"type": "error", "error": {"type", "message"}}`, Ollama `{"error": "message"}`.
"""

from __future__ import annotations

from dataclasses import dataclass

# HTTP status -> (OpenAI error type, Anthropic error type)
_TYPES = {
    400: ("invalid_request_error", "invalid_request_error"),
    401: ("authentication_error", "authentication_error"),
    403: ("permission_error", "permission_error"),
    404: ("not_found_error", "not_found_error"),
    405: ("invalid_request_error", "invalid_request_error"),
    408: ("timeout_error", "timeout_error"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_error"),
    500: ("server_error", "api_error"),
    501: ("not_implemented_error", "api_error"),
    503: ("service_unavailable_error", "overloaded_error"),
    504: ("timeout_error", "timeout_error"),
}


@dataclass
class ApiError(Exception):
    status: int
    message: str
    param: str | None = None  # the offending field, e.g. "messages[2].content"
    code: str | None = None

    def __str__(self) -> str:
        return self.message


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


def protocol_of(path: str) -> str:
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/api/v0/"):
        return "openai"  # LM Studio's REST API uses OpenAI's error shape
    if path.startswith("/api/"):
        return "ollama"
    return "openai"


def error_body(protocol: str, error: ApiError) -> dict:
    openai_type, anthropic_type = _TYPES.get(error.status, ("server_error", "api_error"))
    if protocol == "anthropic":
        return {"type": "error", "error": {"type": anthropic_type, "message": error.message}}
    if protocol == "ollama":
        return {"error": error.message}
    return {
        "error": {
            "message": error.message,
            "type": openai_type,
            "param": error.param,
            "code": error.code or (str(error.status) if error.status >= 500 else None),
        }
    }
