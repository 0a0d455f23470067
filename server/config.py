"""`ember serve` settings: one frozen dataclass, filled from CLI flags, each also readable from EMBER_*."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields

from ..runtime.loading.known_models import DEFAULT_MODEL


@dataclass(frozen=True)
class ServeConfig:
    model: str = DEFAULT_MODEL  # a known model name or a path (GGUF file, HF folder)
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None  # when set, every route but /health needs it (Bearer or x-api-key)
    served_model_name: str | None = None  # the name clients use; default: the model's own name
    ctx: int | None = None  # longest context of one request (prompt + output); default min(model's, 8192)
    kv_memory_gib: float = 2.0  # KV pool budget; the pool always holds at least one full context
    kv_cache_dtype: str = "auto"  # the KV pool's element type: auto (the plan's activations), fp8 (e4m3), ...
    # host memory for KV blocks (and hybrids' recurrent-state snapshots) evicted from the device prefix cache
    # (runtime/state/host_tier.py); 0 = off,
    # None = the target's default (host_tier_bytes)
    prefix_cache_host_gib: float | None = None
    max_num_seqs: int = 16
    max_batched_tokens: int | None = None  # tokens per engine step; default: the plan's largest prefill bucket
    max_queue_depth: int = 256
    request_timeout: float = 600.0  # seconds from arrival; past it a request ends with 504
    max_output_tokens: int | None = None  # cap for a request that omits max_tokens; default: the context
    deterministic: bool = False
    target: str = "cpu"
    # a JSON file of kernel policy overrides (compiler/targets/policy.py) over the target's: experiments
    kernel_policy: str | None = None
    # "fast" (the target's kernel policy) or "exact" (no weight kept quantized: runtime/loading/model.py PRECISIONS)
    precision: str = "fast"
    cors_origins: tuple[str, ...] = ()  # empty: CORS off; "*" allows any origin
    max_body_bytes: int = 8 * 1024 * 1024
    heartbeat_s: float = 5.0  # SSE comment while a stream is queued or in a long prefill
    drain_grace_s: float = 30.0  # on SIGTERM: how long in-flight requests may finish
    stream_usage: bool = True  # the final usage chunk of OpenAI streams (also per request stream_options)
    precompile: bool = True  # compile step shapes before /health turns ready
    # with precompile: the target's ready step shapes before ready, the others on a thread between requests;
    # False: every step shape before ready
    background_compile: bool = True
    speculative: str | None = None  # speculative decoding: ngram | draft (docs/speculative.md); None = off
    draft_model: str | None = None  # --speculative draft: a known model name or a path
    num_speculative_tokens: int = 4  # k: most drafts per row and step
    tensor_parallel: int = 1  # devices of this host the model is spread over (runtime/loading/sharding.py)
    expert_parallel: bool = False  # with tensor_parallel > 1: MoE experts split by expert, not by width
    # several processes over one global mesh (runtime/multihost/): process 0's HOST:PORT, how many, which one this is
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    group_silence_timeout_s: float = 10.0  # a process of the group silent this long fails it (every request)
    group_step_timeout_s: float = 300.0  # a step not back this long fails the group (covers first compiles)

    def __post_init__(self):
        # FP8 pools where their writes are the kernels' own (the h200 target's RoPE + K/V write). XLA rewrites a
        # scatter into a float8 array as a conversion of the whole array: 33 ms against 0.02 ms for float32 on
        # a 16 MB pool on the CPU, so the cpu target, and the deterministic plans (XLA's scatter), refuse it.
        from ..runtime.state.kv_dtypes import is_fp8

        if self.speculative is not None and self.deterministic:
            self._check_deterministic_speculation()
        self.speculative_config()  # checks the method and k
        self.mesh()  # checks --expert-parallel has a mesh to split over
        self.group()  # checks the three process-group settings go together

        if is_fp8(self.kv_cache_dtype):
            if self.target == "cpu":
                raise ValueError(
                    "--kv-cache-dtype fp8 needs a GPU target (--target h200): on the CPU every KV "
                    "write would convert the whole FP8 pool"
                )
            if self.deterministic:
                raise ValueError(
                    "--kv-cache-dtype fp8 is not available with --deterministic: its plans write KV "
                    "through XLA's scatter, which converts the whole FP8 pool"
                )

    def host_tier_bytes(self, kv_pool_bytes: int, available_bytes: int | None = None) -> int:
        """The prefix cache host tier's budget: --prefix-cache-host-gib, or by default the target's
        `host_tier_ratio` times the device KV pool's bytes, at most a quarter of the host's available memory
        (0 on the cpu target; 0 for a process group, which keeps no tier yet)."""
        from ..compiler.targets import get_target

        if self.prefix_cache_host_gib is not None:
            return int(self.prefix_cache_host_gib * 2**30)
        ratio = get_target(self.target).host_tier_ratio
        if ratio <= 0 or self.group() is not None:
            return 0
        available = _available_host_bytes() if available_bytes is None else available_bytes
        return int(min(ratio * kv_pool_bytes, available // 4))

    def _check_deterministic_speculation(self) -> None:
        """Speculation in deterministic mode where a verify row is proven to give a decode row's bits: targets
        whose deterministic steps are bucketed (runtime/engine/speculation.py check_speculation says the same)."""
        from ..compiler.targets import get_target

        if not get_target(self.target).policy.deterministic.bucketed:
            raise ValueError(
                f"--speculative is not available with --deterministic on --target {self.target}: its deterministic "
                "steps run in fixed tiles, where a verify segment's rows are not proven to give decode rows' logits "
                "bits (docs/speculative.md)"
            )
        if self.speculative == "mtp":
            raise ValueError(
                "--speculative mtp is not available with --deterministic: its steps also return hidden states, "
                "another executable than the deterministic decode step (docs/speculative.md)"
            )

    def mesh(self):
        """The device mesh the model is placed on (compiler/targets/mesh.py)."""
        from ..compiler.targets.mesh import MeshConfig

        return MeshConfig(self.tensor_parallel, self.expert_parallel)

    def group(self):
        """The process group this server is part of (runtime/multihost/group.py); None for one process."""
        from ..runtime.multihost.group import group_from_values

        return group_from_values(
            self.coordinator,
            self.num_processes,
            self.process_id,
            self.group_silence_timeout_s,
            self.group_step_timeout_s,
        )

    def speculative_config(self):
        """The engine's SpeculativeConfig, or None when off."""
        from ..runtime.speculative.config import speculative_config

        return speculative_config(self.speculative, self.draft_model, self.num_speculative_tokens, self.model)


_ENV_PREFIX = "EMBER_"


def _env_name(field_name: str) -> str:
    return _ENV_PREFIX + field_name.upper()


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _available_host_bytes() -> int:
    """The host memory the kernel says is available to a new allocation (MemAvailable), else its free pages."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _kv_cache_dtype(text: str) -> str:
    from ..runtime.state.kv_dtypes import checked_kv_cache_dtype

    try:
        return checked_kv_cache_dtype(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _origins(text: str) -> tuple[str, ...]:
    return tuple(o.strip() for o in text.split(",") if o.strip())


def _precision(text: str) -> str:
    if text not in ("fast", "exact"):
        raise argparse.ArgumentTypeError(f"must be fast or exact, got {text!r}")
    return text


# flag -> (field, parser, help)
_FLAGS = {
    "--model": ("model", str, "a known model name or a path to a GGUF file / HF checkpoint folder"),
    "--host": ("host", str, "address to listen on"),
    "--port": ("port", int, "port to listen on"),
    "--api-key": ("api_key", str, "require this key (Authorization: Bearer KEY or x-api-key: KEY)"),
    "--served-model-name": ("served_model_name", str, "the model name clients see and send"),
    "--ctx": ("ctx", _positive_int, "longest context of one request, prompt + output (tokens)"),
    "--kv-memory-gib": ("kv_memory_gib", _positive_float, "memory for the KV cache pool, GiB"),
    "--kv-cache-dtype": (
        "kv_cache_dtype",
        _kv_cache_dtype,
        "KV cache element type: auto (the activations'), fp8 (e4m3, no scale: half the bytes), bfloat16, float32",
    ),
    "--prefix-cache-host-gib": (
        "prefix_cache_host_gib",
        _non_negative_float,
        "host memory that keeps KV blocks (and recurrent-state snapshots) evicted from the device prefix cache, GiB "
        "(0: off; default: off on the cpu target, else twice the KV pool, at most a quarter of the host's available "
        "memory)",
    ),
    "--max-num-seqs": ("max_num_seqs", _positive_int, "sequences decoded together at most"),
    "--max-batched-tokens": (
        "max_batched_tokens",
        _positive_int,
        "tokens per engine step at most (default: the target's largest prefill chunk)",
    ),
    "--max-queue-depth": ("max_queue_depth", _positive_int, "waiting requests beyond which new ones get 429"),
    "--request-timeout": ("request_timeout", _positive_float, "seconds a request may take before 504"),
    "--max-output-tokens": ("max_output_tokens", _positive_int, "cap for requests that omit max_tokens"),
    "--target": ("target", str, "compiler target of the plans (cpu, h200)"),
    "--precision": (
        "precision",
        _precision,
        "fast (the target's kernels: GGUF weights kept quantized) or exact (every weight dequantized at load; "
        "on the cpu target fp32 reference ops that agree with transformers)",
    ),
    "--kernel-policy": (
        "kernel_policy",
        str,
        "JSON file overriding fields of the target's kernel policy (docs/kernel_policy.md), for experiments",
    ),
    "--cors-origins": ("cors_origins", _origins, "comma-separated allowed origins (* for any); off by default"),
    "--max-body-bytes": ("max_body_bytes", _positive_int, "largest request body accepted (else 413)"),
    "--heartbeat-s": ("heartbeat_s", _positive_float, "SSE heartbeat interval while waiting"),
    "--drain-grace-s": ("drain_grace_s", _positive_float, "SIGTERM: grace period for in-flight requests"),
    "--speculative": (
        "speculative",
        str,
        "speculative decoding: ngram (prompt lookup, Predicted Outputs), draft or mtp",
    ),
    "--draft-model": ("draft_model", str, "--speculative draft: the draft model, a known name or a path"),
    "--num-speculative-tokens": ("num_speculative_tokens", _positive_int, "most draft tokens per row and step (4)"),
    "--tensor-parallel": (
        "tensor_parallel",
        _positive_int,
        "spread the model over this many devices of the host (tensor parallel through XLA SPMD); it must divide "
        "the attention heads",
    ),
    "--coordinator": (
        "coordinator",
        str,
        "HOST:PORT of process 0 when several processes serve one model (jax.distributed; PORT + 1 carries the steps)",
    ),
    "--num-processes": ("num_processes", _positive_int, "with --coordinator: the processes of the group"),
    "--process-id": ("process_id", int, "with --coordinator: this process (0 serves HTTP and schedules)"),
    "--group-silence-timeout-s": (
        "group_silence_timeout_s",
        _positive_float,
        "with --coordinator: a process of the group silent this long (no heartbeat) fails every request (503)",
    ),
    "--group-step-timeout-s": (
        "group_step_timeout_s",
        _positive_float,
        "with --coordinator: a step not back this long fails every request (503); covers first compiles",
    ),
}
_SWITCHES = {
    "--deterministic": ("deterministic", "batch-invariant plans: same tokens and logprobs alone or under load"),
    "--no-stream-usage": ("stream_usage", "omit the usage chunk of OpenAI streams unless a request asks"),
    "--no-precompile": ("precompile", "compile step shapes lazily instead of before serving"),
    "--expert-parallel": ("expert_parallel", "with --tensor-parallel: MoE experts split by expert, not by width"),
    "--no-background-compile": (
        "background_compile",
        "compile every step shape before serving, not only the target's ready ones (the rest in the background)",
    ),
}


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, (name, parse, help_text) in _FLAGS.items():
        parser.add_argument(flag, dest=name, type=parse, default=None, help=f"{help_text} [env {_env_name(name)}]")
    for flag, (name, help_text) in _SWITCHES.items():
        parser.add_argument(
            flag, dest=name, action="store_true", default=None, help=f"{help_text} [env {_env_name(name)}]"
        )


def config_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> ServeConfig:
    """Flags win over EMBER_* variables, which win over the defaults."""
    environ = os.environ if environ is None else environ
    parsers = {name: parse for name, parse, _ in _FLAGS.values()}
    switches = {name for name, _ in _SWITCHES.values()}
    values = {}
    for f in fields(ServeConfig):
        given = getattr(args, f.name, None)
        if given is not None:
            values[f.name] = (not f.default) if f.name in switches and f.default is True else given
            continue
        raw = environ.get(_env_name(f.name))
        if raw is None or raw == "":
            continue
        try:
            values[f.name] = _parse_bool(raw) if f.name in switches else parsers[f.name](raw)
        except (ValueError, argparse.ArgumentTypeError) as error:
            raise SystemExit(f"ember: error: {_env_name(f.name)}={raw!r}: {error}") from None
    try:
        return ServeConfig(**values)
    except ValueError as error:
        raise SystemExit(f"ember: error: {error}") from None
