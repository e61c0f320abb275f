"""The verdicts of a pre-flight check, from best to worst: PASS, SKIP and WARN do not fail a node, FAIL does.

Standard library only: nodekit/bundle.py inlines this module in the shipped preflight.py, which a node runs alone.
"""

from __future__ import annotations

PASS, FAIL, SKIP, WARN = "PASS", "FAIL", "SKIP", "WARN"

_SEVERITY = {PASS: 0, SKIP: 1, WARN: 2, FAIL: 3}


def _worst(*statuses: str) -> str:
    return max(statuses, key=_SEVERITY.__getitem__) if statuses else PASS
