"""Counters for what a hostile request costs the portal, in place of a stopwatch: the bytes read from request bodies
and the text each of the portal's patterns searched. Both are what a slow answer is made of, and neither depends
on how busy the machine is."""

import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from django.test.client import FakePayload

from tests.builders.production import PRODUCTION_CHAINS

PORTAL_PACKAGES = ("booking", "infrastructure", "inventory", "payments", "portal", "provisioning", "web")
_SCANS = {"search", "match", "fullmatch", "findall", "finditer", "split"}
_REPLACES = {"sub", "subn"}  # (repl, string)


@pytest.fixture
def body_reads(monkeypatch) -> list[int]:
    """The size of every read from the body of a request the test client sends (`sum()`: the bytes read)."""
    reads: list[int] = []
    real = FakePayload.read

    def read(self, size=-1, /):
        content = real(self, size)
        reads.append(len(content))
        return content

    monkeypatch.setattr(FakePayload, "read", read)
    return reads


class PatternReads:
    """The length of the text of every call to a compiled pattern held by a module of the portal."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def longest(self) -> int:
        return max((length for _name, length in self.calls), default=0)

    def by_pattern(self) -> Counter:
        return Counter(name for name, _length in self.calls)

    def clear(self) -> None:
        self.calls.clear()


class _PatternSpy:
    def __init__(self, pattern: re.Pattern, name: str, reads: PatternReads) -> None:
        self._pattern = pattern
        self._name = name
        self._reads = reads

    def __getattr__(self, attribute: str):
        real = getattr(self._pattern, attribute)
        if attribute not in _SCANS | _REPLACES:
            return real

        def spied(*args, **kwargs):
            text = args[1] if attribute in _REPLACES else args[0]
            self._reads.calls.append((self._name, len(text)))
            return real(*args, **kwargs)

        return spied


@pytest.fixture
def pattern_reads(monkeypatch) -> PatternReads:
    """Every module-level compiled pattern of the portal's packages, spied for the length of what it searches."""
    reads = PatternReads()
    for module_name, module in list(sys.modules.items()):
        if module is None or module_name.split(".")[0] not in PORTAL_PACKAGES:
            continue
        for attribute, value in list(vars(module).items()):
            if isinstance(value, re.Pattern):
                monkeypatch.setattr(module, attribute, _PatternSpy(value, f"{module_name}.{attribute}", reads))
    return reads


@pytest.fixture
def production_chains(tmp_path) -> Path:
    path = tmp_path / "chains.toml"
    path.write_text(PRODUCTION_CHAINS)
    return path
