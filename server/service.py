"""The model behind the server: loading, prompts, and submitting to the one engine.

Every protocol handler goes through `ModelService`: it renders chat messages with the model's template,
encodes prompts, fills sampling settings (the checkpoint's generation_config for what a request omits),
and submits to the engine, turning the runtime's exceptions into `ApiError`s (400 with the field,
429 when the queue is full, 503 while loading or draining).
"""

from __future__ import annotations

import functools
import math
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..runtime.engine.config import capacity_line
from ..runtime.engine.engine import Engine, EngineFailedError, kv_bytes_per_block, sized_config
from ..runtime.engine.streams import RequestStream
from ..runtime.execution.hidden_states import Embedder
from ..runtime.loading.known_models import cache_dir, resolve_model
from ..runtime.loading.model import Model, load_model
from ..runtime.loading.text.chat_template import ChatTemplate, ChatTemplateError
from ..runtime.loading.text.prompting import end_of_generation_ids, load_tokenizer
from ..runtime.loading.weight_bytes import WeightBytes, weight_bytes
from ..runtime.sampling.params import SamplingParams
from ..runtime.scheduling.requests import QueueFullError
from .config import ServeConfig
from .errors import ApiError, bad_request
from .fim import FimTokens, detect_fim_tokens
from .metrics import ServerMetrics
from .tool_format import ToolCallFormat, tool_call_format_for_template

CPU_DEFAULT_CONTEXT = 8192  # the default --ctx cap: a decode step reads every block of the table width
# Template inputs a request may not override through chat_template_kwargs: they change how the
# template itself works rather than what it says.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "bos_token",
        "eos_token",
        "chat_template",
        "tokenize",
        "raise_exception",
        "strftime_now",
    }
)
_SAMPLING_FIELDS = frozenset(f.name for f in fields(SamplingParams))


class ModelService:
    def __init__(self, config: ServeConfig):
        self.config = config
        self.state = "loading"  # loading -> ready -> draining; or failed
        self.load_error: str | None = None
        self.model: Model | None = None
        self.engine: Engine | None = None
        self.tokenizer = None
        self.template: ChatTemplate | None = None
        # how the served model writes tool calls, as its chat template shows it (JSON or XML form): set at load
        self.tool_format: ToolCallFormat = tool_call_format_for_template(None)
        self.eos_ids: frozenset[int] = frozenset()
        self.fim_tokens: FimTokens | None = None  # the model's fill-in-the-middle markers: set at load
        self.model_name = config.served_model_name or _model_name(config.model)
        self.created = int(time.time())
        self.load_seconds: float | None = None
        self.compile_seconds: float | None = None
        self.group = None  # process 0's LeaderGroup when several processes serve the model
        self.capacity: str | None = None  # what the state pools hold (the startup line says it)
        self.weight_bytes: WeightBytes | None = None  # device weight bytes vs the checkpoint's (startup line, /v1/info)
        self._ready = threading.Event()
        self.metrics = ServerMetrics(self)
        self.in_flight = 0  # generations between submit and their last output (SIGTERM drain waits for 0)

    # ---- lifecycle ------------------------------------------------------------------------------

    def load(self) -> None:
        """Blocking: resolve, load, build the engine, compile its step shapes. Run off the event loop."""
        try:
            started = time.perf_counter()
            path = resolve_model(self.config.model, progress=True)
            model = load_model(
                path,
                target=self.config.target,
                progress=True,
                kernel_policy=self.config.kernel_policy,
                precision=self.config.precision,
                mesh=self.config.mesh(),
                prepared_cache=True,  # on the cpu backend: a restart maps the weights instead of converting them
            )
            tokenizer = load_tokenizer(model.checkpoint, cache_dir() / "prepared-tokenizers")
            self.model, self.tokenizer = model, tokenizer
            self.weight_bytes = weight_bytes(model)
            if tokenizer.chat_template:
                self.template = ChatTemplate(
                    tokenizer.chat_template,
                    bos_token=tokenizer.bos_token,
                    eos_token=tokenizer.eos_token,
                    origin="model",
                )
                self.tool_format = tool_call_format_for_template(self.template.source)
            self.eos_ids = end_of_generation_ids(tokenizer, model.checkpoint.generation_config)
            self.fim_tokens = detect_fim_tokens(tokenizer)
            context = self._context_length(model)
            kv_bytes = int(self.config.kv_memory_gib * 2**30)
            block = 16
            kv_cache_dtype = self.config.kv_cache_dtype
            min_bytes = kv_bytes_per_block(model, block, kv_cache_dtype=kv_cache_dtype) * math.ceil(context / block)
            kv_bytes = max(kv_bytes, min_bytes)
            engine_config = sized_config(
                model,
                kv_memory_bytes=kv_bytes,
                block_size=block,
                max_model_len=context,
                max_num_seqs=self.config.max_num_seqs,
                max_batched_tokens=self.config.max_batched_tokens
                or max(model.plan.manifest["entries"]["forward"]["prefill_buckets"]),
                max_queue_depth=self.config.max_queue_depth,
                deterministic=self.config.deterministic,
                max_queue_wait_s=self.config.request_timeout,
                keep_executables=True,
                kv_cache_dtype=kv_cache_dtype,
                prefix_cache_host_bytes=self.config.host_tier_bytes(kv_bytes),
                speculative=self.config.speculative_config(),
            )
            group = self.config.group()
            if group is not None:  # process 0 of several: the others run every step with us
                from ..runtime.multihost.mirror import LeaderGroup, group_engine_config

                engine_config = group_engine_config(model, engine_config)
                self.group = LeaderGroup(group)
            self.engine = Engine(model, tokenizer, engine_config, stop_token_ids=self.eos_ids, group=self.group)
            self.capacity = capacity_line(model, engine_config)
            self.load_seconds = time.perf_counter() - started
            if self.config.precompile:
                # the shapes a first request takes, before ready; the target's other shapes on a thread after
                later = self.config.background_compile
                self.compile_seconds = self.engine.precompile(progress=True, ready_only=later)
                if later:
                    self.engine.compile_in_background()
            self.state = "ready"
        except Exception as error:  # reported by /health and the log; the server keeps answering 503
            self.state, self.load_error = "failed", f"{type(error).__name__}: {error}"
            if self.group is not None:  # the other processes wait for steps that will never come
                self.group.close()
            print(f"ember: error: loading {self.config.model} failed: {self.load_error}", file=sys.stderr)
        finally:
            self._ready.set()

    def build_grammar_tokenizer(self) -> None:
        """llguidance's view of the vocabulary (1-3 s for 150k tokens, holding the interpreter): the server builds
        it after its serving line; a guided request before that waits for it (Engine.grammar_tokenizer's lock)."""
        if self.engine is None:
            return
        try:
            self.engine.grammar_tokenizer()
        except ValueError as error:
            print(f"ember: constrained decoding unavailable: {error}", file=sys.stderr)

    def _context_length(self, model: Model) -> int:
        trained = int(model.dims.as_dict().get("max_context") or 0) or None
        if self.config.ctx is not None:
            return min(self.config.ctx, trained) if trained else self.config.ctx
        return min(trained or CPU_DEFAULT_CONTEXT, CPU_DEFAULT_CONTEXT)

    def wait_loaded(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()  # with a group: tells the other processes to exit
        elif self.group is not None:
            self.group.close()

    @property
    def is_ready(self) -> bool:
        return self.state == "ready" and self.engine_failure is None

    @property
    def engine_failure(self) -> str | None:
        """Why the engine thread stopped, if it did (runtime/engine/engine.py EngineFailedError)."""
        return self.engine.failure if self.engine is not None else None

    def failure_line(self) -> str:
        """Why the engine stopped (engine_failure is set), as /health and refused requests say it."""
        if self.group is not None and self.group.failure is not None:  # "the process group broke: process 1 ..."
            return f"{self.engine_failure}; restart every process of the group"
        return f"the engine stopped after an internal error: {self.engine_failure}; restart the server"

    def require_ready(self) -> Engine:
        if self.engine_failure is not None:
            raise ApiError(503, self.failure_line())
        if self.state == "ready" and self.engine is not None:
            return self.engine
        if self.state == "draining":
            raise ApiError(503, "the server is shutting down")
        if self.state == "failed":
            raise ApiError(503, f"the model failed to load: {self.load_error}")
        raise ApiError(503, "the model is still loading")

    def check_model(self, requested: Any, param: str = "model") -> None:
        """404 for a model name that is not the one served (absent means the served one)."""
        if requested is None or requested == "":
            return
        if not isinstance(requested, str):
            raise bad_request("model must be a string", param)
        if requested not in (self.model_name, self.config.model):
            raise ApiError(
                404,
                f"the model '{requested}' does not exist; this server serves '{self.model_name}'",
                param,
                code="model_not_found",
            )

    # ---- what the protocols share ---------------------------------------------------------------

    @property
    def context_length(self) -> int:
        return self.engine.config.max_model_len if self.engine is not None else (self.config.ctx or 0)

    @property
    def vocab_size(self) -> int:
        return int(self.model.dims.vocab)

    def render_chat(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
        param: str = "messages",
    ) -> str:
        self.require_ready()
        if self.template is None:
            raise bad_request("this model has no chat template: use the completions endpoint", param)
        kwargs = dict(template_kwargs or {})
        refused = sorted(set(kwargs) & RESERVED_TEMPLATE_KWARGS)
        if refused:
            raise bad_request(f"chat_template_kwargs may not set {', '.join(refused)}", "chat_template_kwargs")
        try:
            return self.template.render(
                messages, tools=tools or None, add_generation_prompt=add_generation_prompt, **kwargs
            )
        except ChatTemplateError as error:
            raise bad_request(f"the chat template rejected the messages: {error.problem}", param) from error

    def encode_chat(self, text: str) -> list[int]:
        """A rendered chat prompt: the template wrote every special token already."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True)

    def check_token_ids(self, ids: Any, param: str) -> list[int]:
        if not isinstance(ids, list) or not ids:
            raise bad_request("expected a non-empty list of token ids", param)
        vocab = self.vocab_size
        for i, token in enumerate(ids):
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab:
                raise bad_request(f"token ids must be integers in [0, {vocab})", f"{param}[{i}]")
        return list(ids)

    def sampling_params(
        self, fields_given: Mapping[str, Any], *, rename: Mapping[str, str] | None = None
    ) -> SamplingParams:
        """SamplingParams from a request's fields (SamplingParams names; None = omitted), on top of the
        checkpoint's generation_config. `rename` maps field names back to the protocol's for errors."""
        engine = self.require_ready()
        given = {k: v for k, v in fields_given.items() if v is not None}
        try:
            params = engine.default_params(**given)
            params.validate(self.vocab_size)
        except (ValueError, TypeError) as error:
            name = str(error).split(":", 1)[0]
            param = (rename or {}).get(name, name) if name in _SAMPLING_FIELDS else None
            raise bad_request(str(error), param) from error
        return params

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        request_id: str,
        max_tokens_param: str = "max_tokens",
        prompt_param: str = "messages",
        prediction_ids: tuple[int, ...] = (),
    ) -> RequestStream:
        """Queue a request. max_tokens absent: until the model stops, up to the configured cap."""
        engine = self.require_ready()
        room = self.context_length - len(prompt_ids)
        if room < 1:
            raise bad_request(
                f"the prompt is {len(prompt_ids)} tokens; this model's context is {self.context_length} tokens",
                prompt_param,
            )
        if params.max_tokens is None:
            cap = min(room, self.config.max_output_tokens or room)
            params = replace(params, max_tokens=cap)
        elif params.max_tokens > room:
            raise bad_request(
                f"max_tokens ({params.max_tokens}) + the prompt ({len(prompt_ids)} tokens) exceed "
                f"the context of {self.context_length} tokens",
                max_tokens_param,
            )
        try:
            return engine.submit(prompt_ids, params, request_id=request_id, prediction_ids=prediction_ids)
        except QueueFullError as error:
            raise ApiError(429, str(error)) from error
        except EngineFailedError as error:
            raise ApiError(503, f"{error}; restart the server") from error
        except ValueError as error:
            raise bad_request(str(error)) from error

    def grammar_tokenizer(self):
        """llguidance's tokenizer for the served model (tool-call grammars name special tokens through it)."""
        try:
            return self.require_ready().grammar_tokenizer().lltokenizer
        except ValueError as error:
            raise ApiError(400, f"this model cannot do constrained decoding: {error}") from error

    @functools.cached_property
    def embedder(self) -> Embedder:
        """The served model's sentence embeddings (made on first use: its own jitted pass)."""
        self.require_ready()
        if self.group is not None:  # a device call outside the engine's steps would not reach the other processes
            raise ApiError(501, "embeddings are not available while several processes serve the model")
        return Embedder(self.model)

    def abort(self, request_id: str) -> None:
        if self.engine is not None:
            self.engine.abort(request_id)


def _model_name(model: str) -> str:
    path = Path(model).expanduser()
    if path.exists():
        return path.stem if path.is_file() else path.name
    return model
