"""`--policy family.field=value[,family.field=value]` for the developer checks: the kernel policy
(compiler/targets/policy.py) their kernels are traced with, e.g. `--policy quant_gemv.act_terms=2`."""

from __future__ import annotations

from collections.abc import Callable

from ember.compiler.targets.policy import overriding, parse_assignments


def run_with_policy(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """main(argv) with `--policy ASSIGNMENTS` taken out of argv and applied to the kernel policy around it."""
    overrides = {}
    if "--policy" in argv:
        at = argv.index("--policy")
        overrides, argv = parse_assignments(argv[at + 1]), argv[:at] + argv[at + 2 :]
    with overriding(overrides):
        return main(argv)
