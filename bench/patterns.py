"""The markup patterns on user input against the shapes of issue 13 that made them slow, timed on 1 and 2 MB: twice
the input must take about twice the time (a quadratic pattern takes four times, and hours on these sizes).

    .venv/bin/python bench/patterns.py

Each pattern and shape is timed as the best of 3 runs. Targets (issue 13): on 2 MB under 0.5 s, and the 2 MB time
under 3x the 1 MB time (+ 0.05 s), each printed PASS or FAIL. tests/portal/test_request_limits.py checks the same
patterns' answers on 2 MB of each shape, without a stopwatch.
"""

import contextlib
import os
import sys
import time
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django.setup()

from django.core.exceptions import ValidationError  # noqa: E402

from booking import report_schema  # noqa: E402
from web.customer.forms import no_markup  # noqa: E402

PATTERNS = {
    "booking forms (no_markup)": no_markup,
    "split-trial report (report_schema.MARKUP)": lambda text: report_schema.MARKUP.search(text),
}
SHAPES = {
    "spaces": lambda n: "<" + " " * n + "1",
    "many-opens": lambda n: "< " * (n // 2),
    "slash": lambda n: "<" + " " * (n // 2) + "/" + " " * (n // 2) + "1",
    "entity": lambda n: "&#" + "a" * n,
}
SIZES = (1_000_000, 2_000_000)
LARGEST_S = 0.5
RATIO = 3


def best_of(check, text: str, runs: int = 3) -> float:
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        with contextlib.suppress(ValidationError):
            check(text)
        timings.append(time.perf_counter() - started)
    return min(timings)


def main() -> None:
    print(f"load average: {' '.join(f'{figure:.2f}' for figure in os.getloadavg())} on {os.cpu_count()} cores\n")
    failures = 0
    for pattern_name, check in PATTERNS.items():
        for shape_name, shape in SHAPES.items():
            small, large = (best_of(check, shape(size)) for size in SIZES)
            passed = large < LARGEST_S and large < RATIO * small + 0.05
            failures += not passed
            print(
                f"{'PASS' if passed else 'FAIL'}  {pattern_name:30s} {shape_name:11s} "
                f"1 MB {small * 1000:7.1f} ms  2 MB {large * 1000:7.1f} ms  ratio {large / small if small else 0:4.2f}"
                f"  (targets: 2 MB < {LARGEST_S * 1000:.0f} ms, ratio < {RATIO})"
            )
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
