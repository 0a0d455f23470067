"""tools/dev/gpu_test_counts.py: the GPU suite's counts from pytest's JUnit XML and Hypothesis statistics."""

from ember.tools.dev.gpu_test_counts import hypothesis_examples, junit_counts, summarize

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.test_a_gpu" name="test_one[1]" file="tests/test_a_gpu.py" time="1.5"/>
<testcase classname="tests.test_a_gpu" name="test_one[2]" file="tests/test_a_gpu.py" time="0.5">
  <failure message="assert 1 == 2">trace</failure></testcase>
<testcase classname="tests.test_b_gpu" name="test_two" time="2.0"><skipped message="no GPU"/></testcase>
<testcase classname="tests.test_b_gpu" name="test_three" time="0.1"><error message="fixture">trace</error></testcase>
</testsuite></testsuites>"""

LOG = """============================ Hypothesis Statistics =============================
tests/test_a_gpu.py::test_prop:

  - during reuse phase (0.10 seconds):
    - 2 passing, 0 failing, and 0 invalid test cases

  - during generate phase (3.39 seconds):
    - Typical runtimes: ~ 3-10 ms, of which ~ 2-4 ms in data generation
    - 40 passing, 1 failing, and 8 invalid test cases

tests/test_b_gpu.py::test_other[x]:

  - during generate phase (1.0 seconds):
    - 5 passing, 0 failing test cases
"""


def test_junit_counts_per_file_and_outcome():
    files = junit_counts(JUNIT)
    assert files["tests/test_a_gpu.py"] == {
        "passed": 1,
        "failed": 1,
        "errors": 0,
        "skipped": 0,
        "seconds": 2.0,
        "failures": ["test_one[2]"],
    }
    # without a file attribute the path comes from the class name
    assert files["tests/test_b_gpu.py"]["skipped"] == 1 and files["tests/test_b_gpu.py"]["errors"] == 1


def test_hypothesis_examples_sum_the_phases():
    assert hypothesis_examples(LOG) == {
        "tests/test_a_gpu.py::test_prop": {"passing": 42, "failing": 1, "invalid": 8},
        "tests/test_b_gpu.py::test_other[x]": {"passing": 5, "failing": 0, "invalid": 0},
    }


def test_summary_totals():
    totals = summarize(JUNIT, LOG, "abc1234")["totals"]
    assert totals == {
        "passed": 1,
        "failed": 1,
        "errors": 1,
        "skipped": 1,
        "hypothesis_examples_passing": 47,
        "hypothesis_examples_failing": 1,
    }
