"""The GPU test suite's counts as a JSON record: per test file passed / failed / errors / skipped (from pytest's
JUnit XML) and, per property test, the examples Hypothesis ran (from --hypothesis-show-statistics output).

    python -m ember.tools.dev.gpu_test_counts --junit gpu_suite.xml --log gpu_suite.log --commit <sha> \
        --out docs/results/h200_gpu_suite_<sha>.json

`tools/dev/h200_run.sh gpu-suite` writes both inputs on the H200; this runs anywhere (standard library only).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

OUTCOMES = ("passed", "failed", "errors", "skipped")
# "tests/test_x.py::test_y[case]:" then, in its block, "- 40 passing, 0 failing, and 8 invalid test cases"
_STATS_TEST = re.compile(r"^(tests/\S+::\S+):\s*$")
_STATS_CASES = re.compile(r"- (\d+) passing, (\d+) failing(?:, and (\d+) invalid)? test cases")


def junit_counts(xml_text: str) -> dict[str, dict]:
    """{file: {passed, failed, errors, skipped, seconds, failures: [test names]}} from a JUnit XML report."""
    files: dict[str, dict] = defaultdict(lambda: {**{k: 0 for k in OUTCOMES}, "seconds": 0.0, "failures": []})
    for case in ElementTree.fromstring(xml_text).iter("testcase"):
        path = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        entry = files[path]
        entry["seconds"] = round(entry["seconds"] + float(case.get("time") or 0.0), 2)
        tags = {child.tag for child in case}
        outcome = (
            "failed"
            if "failure" in tags
            else "errors"
            if "error" in tags
            else "skipped"
            if "skipped" in tags
            else "passed"
        )
        entry[outcome] += 1
        if outcome in ("failed", "errors"):
            entry["failures"].append(case.get("name"))
    return dict(sorted(files.items()))


def hypothesis_examples(log_text: str) -> dict[str, dict]:
    """{test id: {passing, failing, invalid}} summed over phases, from pytest's Hypothesis statistics section."""
    tests: dict[str, dict] = {}
    current = None
    for line in log_text.splitlines():
        if match := _STATS_TEST.match(line.strip()):
            current = tests.setdefault(match.group(1), {"passing": 0, "failing": 0, "invalid": 0})
        elif current is not None and (match := _STATS_CASES.search(line)):
            current["passing"] += int(match.group(1))
            current["failing"] += int(match.group(2))
            current["invalid"] += int(match.group(3) or 0)
    return tests


def summarize(xml_text: str, log_text: str, commit: str) -> dict:
    files = junit_counts(xml_text)
    examples = hypothesis_examples(log_text)
    totals = {k: sum(f[k] for f in files.values()) for k in OUTCOMES}
    totals["hypothesis_examples_passing"] = sum(t["passing"] for t in examples.values())
    totals["hypothesis_examples_failing"] = sum(t["failing"] for t in examples.values())
    return {
        "what": "the GPU test suite (pytest -m gpu) on the H200",
        "commit": commit,
        "totals": totals,
        "files": files,
        "hypothesis": examples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junit", required=True)
    parser.add_argument("--log", required=True, help="pytest's output with --hypothesis-show-statistics")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--out", help="JSON file (default: stdout)")
    args = parser.parse_args(argv)
    record = summarize(Path(args.junit).read_text(), Path(args.log).read_text(errors="replace"), args.commit)
    text = json.dumps(record, indent=1) + "\n"
    Path(args.out).write_text(text) if args.out else sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
