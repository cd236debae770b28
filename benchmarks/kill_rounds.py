"""Many rounds of SIGKILLed worker processes (the long variant of the reliability suite).

Runs ``tests/reliability/test_worker_kills.py::test_many_rounds_of_sigkilled_workers``: 3,000
traces, three variants (two without a judge, one through the scripted judge server), 25 rounds
in which two ``recalltrace worker`` processes are SIGKILLed at random moments, then a last
worker until nothing is due. Passes when the final scores are exactly the expected set: each
(trace, variant) once with the value the scorers give. The seed is the start time (printed).

Run: ``python -m benchmarks.kill_rounds [extra pytest arguments]``
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import ROOT


def main() -> int:
    env = dict(os.environ, RECALLTRACE_SLOW="1")
    command = [
        sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
        "tests/reliability/test_worker_kills.py::test_many_rounds_of_sigkilled_workers",
        *sys.argv[1:],
    ]  # fmt: skip
    return subprocess.call(command, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
