"""The browser the tests drive sees none of the host's network changes: it runs in a network namespace of its own
(tests/browser/isolated_chromium.py), while the host's tests beside it add and remove bridges, veths and addresses
that would fail a request in flight with net::ERR_NETWORK_CHANGED. Its only way out is a relay to the loopback."""

import os
from pathlib import Path

import pytest
from playwright.sync_api import Error as PlaywrightError


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # a process that ended meanwhile
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _browser_namespaces() -> set[str]:
    """The network namespaces of the Chromium processes this test process started (through Playwright's driver)."""
    namespaces = set()
    for pid in _descendants(os.getpid()):
        try:
            if os.readlink(f"/proc/{pid}/exe").endswith("/chromium"):
                namespaces.add(os.readlink(f"/proc/{pid}/ns/net"))
        except OSError:
            continue
    return namespaces


def test_the_browser_has_a_network_of_its_own_and_still_reaches_the_live_server(page, live_server):
    response = page.goto(f"{live_server.url}/healthz")

    assert response.status == 200
    namespaces = _browser_namespaces()
    assert namespaces, "no Chromium process found under this test's process"
    assert os.readlink("/proc/self/ns/net") not in namespaces
    assert len(namespaces) == 1  # the browser's processes share the one namespace the relay serves


def test_the_browser_reaches_nothing_but_this_machine(page):
    with pytest.raises(PlaywrightError, match="ERR_SOCKS_CONNECTION_FAILED"):
        page.goto("http://192.0.2.1/", timeout=15_000)  # TEST-NET-1: refused by the relay, not waited for
