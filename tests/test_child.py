"""tests/child.py: a child's result survives whatever its other threads write to stdout."""

from __future__ import annotations

import pytest

from tests.child import run_python

# a thread writes text without line ends while the main thread reports, as a log handler did on the
# line of a DAG run's result
NOISY = """
import sys, threading, time
stop = threading.Event()
def noise():
    while not stop.is_set():
        sys.stdout.write(' [adapter.py:206] '); sys.stdout.flush()
thread = threading.Thread(target=noise); thread.start()
time.sleep(0.05)
print('DAG_RUN ', end='')
report({"state": "success", "argv": sys.argv[1:]})
time.sleep(0.05)
stop.set(); thread.join()
"""


def test_the_result_comes_back_whole_while_another_thread_writes_to_stdout():
    child = run_python(NOISY, "a", "b c", timeout=60)
    assert child.result == {"state": "success", "argv": ["a", "b c"]}
    assert "[adapter.py:206]" in child.stdout  # the noise did reach stdout


def test_a_child_that_reports_nothing_or_fails_fails_the_test_with_its_output():
    with pytest.raises(AssertionError, match="without a result:\n.*said this"):
        run_python("print('said this')", timeout=60)
    with pytest.raises(AssertionError, match="child exited 3.*\n.*went wrong"):
        run_python("print('went wrong'); report(1); raise SystemExit(3)", timeout=60)
    unchecked = run_python("import sys; sys.exit(4)", check=False, timeout=60)
    assert (unchecked.returncode, unchecked.reported, unchecked.result) == (4, False, None)
