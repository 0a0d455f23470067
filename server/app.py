"""The Sanic application: one process, one engine, every protocol's routes, and the lifecycle.

Startup: the server listens at once and loads the model in a worker thread; `/health` answers 503
until the model is loaded and its step shapes compiled, then prints the URL. SIGTERM/SIGINT: stop
accepting (503), let in-flight requests finish for up to the grace period, exit as soon as idle; a
second signal exits at once.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import signal
import sys
import time
import traceback

from sanic import Sanic, response
from sanic.exceptions import SanicException

from .config import ServeConfig
from .errors import ApiError, error_body, protocol_of
from .service import ModelService
from .webui import is_public

PUBLIC_PATHS = frozenset({"/health"})
_app_numbers = itertools.count()


def create_app(config: ServeConfig, service: ModelService | None = None) -> Sanic:
    app = Sanic(f"ember_{next(_app_numbers)}")
    app.config.REQUEST_MAX_SIZE = config.max_body_bytes
    app.config.RESPONSE_TIMEOUT = config.request_timeout + 60  # our own deadline answers first (504)
    app.config.REQUEST_TIMEOUT = 60
    app.config.KEEP_ALIVE_TIMEOUT = 30
    app.config.GRACEFUL_SHUTDOWN_TIMEOUT = 2.0
    app.config.FALLBACK_ERROR_FORMAT = "json"
    service = service or ModelService(config)
    app.ctx.service, app.ctx.config = service, config

    from . import (
        anthropic,
        embeddings,
        ember_routes,
        llamacpp_infill,
        lmstudio,
        ollama,
        openai_chat,
        openai_completions,
        openai_responses,
        webui,
    )

    for module in (
        ember_routes,
        openai_chat,
        openai_completions,
        openai_responses,
        anthropic,
        ollama,
        lmstudio,
        llamacpp_infill,
        embeddings,
        webui,
    ):
        app.blueprint(module.blueprint)

    app.error_handler.add(Exception, _render_error)
    app.register_middleware(_before_request, "request")
    app.register_middleware(_after_response, "response")
    app.register_listener(_after_start, "after_server_start")
    app.register_listener(_before_stop, "before_server_stop")
    return app


def _render_error(request, exception: Exception):
    if isinstance(exception, ApiError):
        error = exception
    elif isinstance(exception, SanicException):
        status = getattr(exception, "status_code", 500) or 500
        message = {404: f"no route {request.method} {request.path}", 413: "the request body is too large"}.get(
            status, str(exception) or "error"
        )
        error = ApiError(status, message)
    else:
        traceback.print_exception(exception)
        error = ApiError(500, f"internal error: {type(exception).__name__}")
    return response.json(error_body(protocol_of(request.path), error), status=error.status)


def _cors_headers(config: ServeConfig, origin: str | None) -> dict[str, str]:
    if not config.cors_origins or not origin:
        return {}
    if "*" in config.cors_origins:
        allowed = "*"
    elif origin in config.cors_origins:
        allowed = origin
    else:
        return {}
    return {
        "Access-Control-Allow-Origin": allowed,
        "Vary": "Origin",
        "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
        "Access-Control-Allow-Headers": "Authorization, Content-Type, x-api-key, anthropic-version",
        "Access-Control-Max-Age": "600",
    }


def _authorized(config: ServeConfig, request) -> bool:
    given = request.headers.get("x-api-key")
    auth = request.headers.get("authorization", "")
    if given is None and auth[:7].lower() == "bearer ":
        given = auth[7:].strip()
    return given is not None and hmac.compare_digest(given.encode(), config.api_key.encode())


async def _before_request(request):
    config: ServeConfig = request.app.ctx.config
    if request.method == "OPTIONS":  # CORS preflight: answered here, never reaches a handler
        return response.empty(status=204, headers=_cors_headers(config, request.headers.get("origin")))
    if request.path in PUBLIC_PATHS or is_public(request.path):  # the chat page asks for the key itself
        return None
    if config.api_key and not _authorized(config, request):
        raise ApiError(401, "invalid or missing API key (send Authorization: Bearer KEY or x-api-key: KEY)")
    if request.app.ctx.service.state == "draining" and request.path != "/metrics":
        raise ApiError(503, "the server is shutting down")
    return None


async def _after_response(request, resp):
    config: ServeConfig = request.app.ctx.config
    for key, value in _cors_headers(config, request.headers.get("origin")).items():
        resp.headers[key] = value
    route = request.route.path if request.route is not None else "unmatched"
    request.app.ctx.service.metrics.http_response(route, resp.status)


async def _after_start(app):
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, _on_signal, app)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests)
            pass
    app.add_task(_load(app, loop))


async def _load(app, loop) -> None:
    service: ModelService = app.ctx.service
    config: ServeConfig = app.ctx.config
    if service.state == "loading" and service.engine is None:
        await loop.run_in_executor(None, service.load)
    if service.is_ready:
        secs = f"loaded in {service.load_seconds:.1f}s" if service.load_seconds is not None else "loaded"
        if service.compile_seconds is not None:
            secs += f", compiled in {service.compile_seconds:.1f}s"
        capacity = f"; {service.capacity}" if service.capacity else ""
        if service.weight_bytes is not None:
            capacity += f"; {service.weight_bytes.line()}"
        if service.model is not None and service.model.placement is not None:
            capacity += f"; on {service.model.placement.describe()}"
        print(
            f"Ember is serving {service.model_name} ({secs}{capacity}) at http://{config.host}:{config.port}",
            flush=True,
        )
        await loop.run_in_executor(None, service.build_grammar_tokenizer)


def _on_signal(app) -> None:
    service: ModelService = app.ctx.service
    if service.state == "draining":  # a second signal: stop now
        print("ember: second signal, stopping now", file=sys.stderr, flush=True)
        app.stop()
        return
    print("ember: draining (new requests get 503); exiting when idle", file=sys.stderr, flush=True)
    service.state = "draining"
    app.add_task(_drain(app))


async def _drain(app) -> None:
    service: ModelService = app.ctx.service
    deadline = time.monotonic() + app.ctx.config.drain_grace_s
    while time.monotonic() < deadline and service.in_flight > 0:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)  # let the last responses flush
    app.stop()


async def _before_stop(app):
    await asyncio.get_running_loop().run_in_executor(None, app.ctx.service.close)


def serve(config: ServeConfig) -> int:
    """Serve until SIGTERM. With --coordinator: join the process group first (before anything touches JAX);
    process 0 serves, the others follow its steps (server/follower.py)."""
    group = config.group()
    if group is not None:
        from ..runtime.multihost.group import check_mesh, initialize

        initialize(group)
        try:
            check_mesh(group, config.tensor_parallel)
        except ValueError as error:
            print(f"ember: error: {error}", file=sys.stderr, flush=True)
            from .follower import leave_group

            return leave_group(2)
        if not group.is_leader:
            from .follower import follow_leader

            return follow_leader(config, group)
    app = create_app(config)
    app.run(
        host=config.host,
        port=config.port,
        single_process=True,
        access_log=False,
        motd=False,
        register_sys_signals=False,
    )
    if group is not None:
        from .follower import leave_group

        leader = app.ctx.service.group
        return leave_group(1 if leader is None or leader.failure is not None else 0)
    return 0
