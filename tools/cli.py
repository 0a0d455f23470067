"""The `ember` command: serve, generate, bench, compile.

stdout carries only generated text; progress and the timing summary go to stderr, so scripts can
pipe the text. Errors print one line (`ember: error: ...`) and exit 1 (2 for bad arguments).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ..runtime.speculative.config import SPECULATIVE_METHODS

PRECISION_HELP = (
    "fast (the target's kernels: GGUF weights kept quantized) or exact (every weight dequantized at load: on the "
    "cpu target the fp32 reference ops that agree with transformers)"
)


def _add_precision(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--precision",
        choices=("fast", "exact"),
        default=os.environ.get("EMBER_PRECISION", "fast"),
        help=f"{PRECISION_HELP} [env EMBER_PRECISION]",
    )


def _add_mesh(parser: argparse.ArgumentParser) -> None:
    """--tensor-parallel / --expert-parallel, as `ember serve` has them (server/config.py)."""
    parser.add_argument(
        "--tensor-parallel",
        type=_positive_int,
        default=_positive_int(os.environ.get("EMBER_TENSOR_PARALLEL") or "1"),
        help="spread the model over this many devices of the host (XLA SPMD) [env EMBER_TENSOR_PARALLEL]",
    )
    parser.add_argument(
        "--expert-parallel",
        action="store_true",
        default=os.environ.get("EMBER_EXPERT_PARALLEL", "").strip().lower() in ("1", "true", "yes", "on"),
        help="with --tensor-parallel: MoE experts split by expert, not by width [env EMBER_EXPERT_PARALLEL]",
    )


def mesh_from_args(args: argparse.Namespace):
    from ..compiler.targets.mesh import MeshConfig

    return MeshConfig(args.tensor_parallel, args.expert_parallel)


def _generate(args: argparse.Namespace) -> int:
    from ..runtime.engine.generate import GenerationStats, generate
    from ..runtime.loading.known_models import resolve_model
    from ..runtime.loading.model import load_model
    from ..runtime.loading.text.prompting import end_of_generation_ids, load_tokenizer, render_chat
    from ..runtime.sampling.params import SamplingParams

    path = resolve_model(args.model, progress=True)
    started = time.perf_counter()
    mesh = mesh_from_args(args)
    model = load_model(path, target=args.target, progress=True, precision=args.precision, mesh=mesh)
    tokenizer = load_tokenizer(model.checkpoint)
    print(
        f"loaded {path.name} ({model.spec.arch}, {model.dims.layers} layers) on {mesh.describe()} "
        f"in {time.perf_counter() - started:.1f}s",
        file=sys.stderr,
    )
    if args.chat:
        text = render_chat(tokenizer, [{"role": "user", "content": args.prompt}])
        prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        prompt_ids = tokenizer.encode(args.prompt, add_special_tokens=True)
    params = SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, max_tokens=args.max_tokens
    )
    params.validate(int(model.dims.vocab))
    stats = GenerationStats()
    eos = end_of_generation_ids(tokenizer, model.checkpoint.generation_config)
    from .bench import speculative_from_args

    speculative = speculative_from_args(args)
    for piece in generate(model, tokenizer, prompt_ids, params, eos_ids=eos, stats=stats, speculative=speculative):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    print(stats.summary(), file=sys.stderr)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from ..server.app import serve
    from ..server.config import config_from_args

    return serve(config_from_args(args))


def _compile(args: argparse.Namespace) -> int:
    from ..compiler.build import GENERATED_DIR, compile_spec
    from ..compiler.spec import SPECS_DIR, known_archs

    specs = [Path(s) for s in args.spec] if args.spec else [SPECS_DIR / f"{a}.toml" for a in known_archs()]
    mesh = mesh_from_args(args)
    if mesh.sharded and not args.out:  # generated/ holds the one-device plans; serving compiles a mesh's itself
        raise ValueError("ember compile --tensor-parallel N writes the mesh's plans to --out DIR, not generated/")
    out = Path(args.out) if args.out else GENERATED_DIR
    for spec in specs:
        dump = Path(args.dump_ir) / spec.stem if args.dump_ir else None
        for written in compile_spec(spec, args.target, out_root=out, dump_dir=dump, mesh=mesh):
            print(written, file=sys.stderr)
    return 0


def _bench(args: argparse.Namespace) -> int:
    if args.suite:
        from .bench_suite import main_suite

        if not args.out:
            raise ValueError("ember bench --suite needs --out DIR")
        return main_suite(args)
    from .bench import main_bench

    return main_bench(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ember", description="Ember: LLM inference from declarative model specs.")
    sub = parser.add_subparsers(dest="command", required=True)

    from ..server.config import add_serve_arguments

    srv = sub.add_parser("serve", help="serve a model over HTTP (OpenAI, Anthropic, Ollama, LM Studio APIs)")
    add_serve_arguments(srv)
    srv.set_defaults(run=_serve)

    gen = sub.add_parser("generate", help="generate text from a prompt")
    gen.add_argument(
        "--model",
        default=os.environ.get("EMBER_MODEL", "qwen2.5-coder-1.5b-instruct"),
        help="a known model name or a path to a GGUF file / HF checkpoint folder",
    )
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template (one user message)")
    gen.add_argument("--max-tokens", type=_positive_int, default=256)
    gen.add_argument("--temperature", type=_non_negative_float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--target", default=os.environ.get("EMBER_TARGET", "cpu"))
    _add_precision(gen)
    _add_mesh(gen)
    _add_speculative_arguments(gen)
    gen.set_defaults(run=_generate)

    bench = sub.add_parser(
        "bench",
        help="aggregate throughput through the engine at several concurrencies (JSON); "
        "--suite: the benchmark suite (JSON + markdown + PNG in --out)",
    )
    bench.add_argument("--model", default=os.environ.get("EMBER_MODEL", "qwen2.5-coder-1.5b-instruct"))
    bench.add_argument("--target", default=os.environ.get("EMBER_TARGET", "cpu"))
    bench.add_argument(
        "--concurrency",
        type=_positive_int,
        nargs="+",
        help="concurrent requests per run (default 1 4 16; --suite: 1 2 4 ... 256)",
    )
    bench.add_argument("--prompt-tokens", type=_positive_int, help="default 256")
    bench.add_argument("--output-tokens", type=_positive_int, help="default 128 (--suite: 256)")
    bench.add_argument("--deterministic", action="store_true")
    _add_precision(bench)
    _add_mesh(bench)
    from ..runtime.state.kv_dtypes import KV_CACHE_DTYPES

    bench.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, help="the engines' KV pool dtype (auto)")
    _add_speculative_arguments(bench)
    bench.add_argument("--tokenizer", help="HF tokenizer folder, for --model synthetic:<shape> (random weights)")
    bench.add_argument(
        "--kernel-policy", help="JSON file overriding fields of the target's kernel policy (docs/kernel_policy.md)"
    )
    from .bench_hf import COMPILE_MODES
    from .bench_suite import SECTIONS as SUITE_SECTIONS

    suite = bench.add_argument_group("suite (--suite)")
    suite.add_argument("--suite", action="store_true", help="run the benchmark suite (tools/bench_suite.py)")
    suite.add_argument(
        "--models",
        nargs="+",
        help="default: the issue's models (synthetic Qwen2.5-1.5B Q4_K_M, Llama-3-8B bf16 / Q4_K_M / FP8)",
    )
    suite.add_argument("--sections", nargs="+", choices=SUITE_SECTIONS, help="default: all")
    suite.add_argument("--out", help="folder for bench.json, bench.md, decode_vs_concurrency.png")
    suite.add_argument("--commit", help="the commit measured (the device copy's git metadata may be stale)")
    suite.add_argument("--no-hf", action="store_true", help="skip the HF transformers baseline")
    suite.add_argument(
        "--contexts", type=_positive_int, nargs="+", help="batch-1 decode contexts (128 4096 16384 32768)"
    )
    suite.add_argument("--context-decode-tokens", type=_positive_int, help="decode tokens timed per context (32)")
    suite.add_argument(
        "--prefill-lengths", type=_positive_int, nargs="+", help="prefill prompt lengths (512 4096 16384)"
    )
    suite.add_argument("--prefill-chunk", type=_positive_int, help="batch-1 engine's max_batched_tokens (4096)")
    suite.add_argument("--ttft-concurrency", type=_positive_int, help="concurrency of the TTFT figure (32)")
    suite.add_argument("--bandwidth-gib", type=float, help="GiB each bandwidth probe (copy, read) streams (4.0)")
    suite.add_argument("--hf-batches", type=_positive_int, nargs="+", help="HF baseline batch sizes (1 32)")
    suite.add_argument("--hf-compile", choices=COMPILE_MODES, help="see tools/bench_hf.py (auto)")
    suite.add_argument("--hf-device", help="torch device of the HF baseline (cuda)")
    suite.add_argument("--hf-python", help="Python with torch + transformers (default: this one)")
    suite.add_argument("--deadline-s", type=float, help="start no section after this many seconds")
    suite.add_argument(
        "--lazy-compile",
        action="store_true",
        help="compile each concurrency's step shapes in an untimed warm-up, not all up front",
    )
    bench.set_defaults(run=_bench)

    comp = sub.add_parser("compile", help="compile specs into generated plans")
    comp.add_argument("--spec", action="append", help="spec file (repeatable); default: every spec in specs/")
    comp.add_argument("--target", default="cpu")
    comp.add_argument("--out", help="output root (default: the package's generated/ folder)")
    comp.add_argument("--dump-ir", help="write the IR after every compiler phase into this folder")
    _add_mesh(comp)
    comp.set_defaults(run=_compile)
    return parser


def _add_speculative_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--speculative",
        choices=SPECULATIVE_METHODS,
        default=env("EMBER_SPECULATIVE") or None,
        help="speculative decoding: ngram (prompt lookup), draft (a draft model) or mtp (the checkpoint's "
        "multi-token-prediction module) [env EMBER_SPECULATIVE]",
    )
    parser.add_argument(
        "--draft-model",
        default=env("EMBER_DRAFT_MODEL") or None,
        help="--speculative draft: a known model name or a path (default: the model's own draft) [env EMBER_DRAFT_MODEL]",
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=_positive_int,
        default=int(env("EMBER_NUM_SPECULATIVE_TOKENS") or 4),
        help="most draft tokens per row and step [env EMBER_NUM_SPECULATIVE_TOKENS]",
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    from ..compiler.spec import SpecError
    from ..runtime.loading.formats.errors import CheckpointError
    from ..runtime.loading.plans import PlanError

    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (CheckpointError, SpecError, PlanError, ValueError) as e:
        print(f"ember: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ember: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
