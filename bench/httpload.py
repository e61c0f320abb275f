"""HTTP load from wrk, Debian's C load generator (`make system-deps` installs it), for bench/pages.py and
bench/load.py.

A Python client saturates before gunicorn does: it then measures itself, and every ratio to the trivial view comes
out inflated (issue 10: the Python threads said 0.66x and 0.9x where wrk measured 0.44-0.50x and 0.79-0.80x). One
round is one wrk run driven by bench/wrk_round.lua, which prints a JSON line (requests, duration, errors, statuses,
wrk's latency distribution) read back here; rounds of one endpoint are pooled: requests over the summed duration,
percentiles over the merged distribution (wrk's, coordinated-omission correction included).
"""

import html.parser
import http.client
import json
import math
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

WRK_SCRIPT = Path(__file__).resolve().with_name("wrk_round.lua")

TRIVIAL = "trivial view /livez"
BOOKING_PAGE = "booking page"
STATUS_POLL = "order status poll (htmx)"
# Issue 10: the share of the trivial view's requests per second each page must keep, on the same server.
TARGETS = {BOOKING_PAGE: 0.5, STATUS_POLL: 0.8}


@dataclass(frozen=True)
class Endpoint:
    name: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    follow_poll: bool = False  # the htmx status poll: go on with the hx-get of each block that comes back


@dataclass
class Tally:
    """The rounds of one endpoint, pooled."""

    requests: int = 0
    duration_us: int = 0
    errors: Counter = field(default_factory=Counter)  # wrk's: connect, read, write, timeout, status (>= 400)
    statuses: Counter = field(default_factory=Counter)
    latency_us: Counter = field(default_factory=Counter)  # microseconds -> count

    def add(self, measured: dict) -> None:
        self.requests += measured["requests"]
        self.duration_us += measured["duration_us"]
        self.errors.update(measured["errors"])
        self.statuses.update({int(status): count for status, count in measured["statuses"].items()})
        self.latency_us.update({value: count for value, count in measured["latency_us"]})

    def merge(self, other: "Tally") -> None:
        self.requests += other.requests
        self.duration_us += other.duration_us
        self.errors.update(other.errors)
        self.statuses.update(other.statuses)
        self.latency_us.update(other.latency_us)

    @property
    def requests_per_second(self) -> float:
        return self.requests / (self.duration_us / 1e6) if self.duration_us else 0.0

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def percentile_ms(self, percent: float) -> float:
        """The same rank as wrk's stats_percentile, over the pooled distribution."""
        samples = sum(self.latency_us.values())
        if not samples:
            return float("nan")
        rank = min(samples, math.floor(percent / 100 * samples + 1))
        seen = 0
        for value in sorted(self.latency_us):
            seen += self.latency_us[value]
            if seen >= rank:
                return value / 1000
        return float("nan")


def require_wrk() -> str:
    return shutil.which("wrk") or sys.exit("wrk is not installed: `make system-deps` (Debian package wrk)")


def wrk_round(port: int, endpoint: Endpoint, *, seconds: int, connections: int, threads: int = 1) -> dict:
    """One wrk run of `seconds` (wrk counts whole seconds) with `connections` kept busy; its JSON line."""
    command = [
        require_wrk(),
        "--latency",
        f"--threads={min(threads, connections)}",
        f"--connections={connections}",
        f"--duration={seconds}s",
        "--timeout=10s",
        f"--script={WRK_SCRIPT}",
    ]
    for name, value in endpoint.headers.items():
        command.append(f"--header={name}: {value}")
    command.append(f"http://127.0.0.1:{port}{endpoint.path}")
    if endpoint.follow_poll:
        command += ["--", "follow-poll"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        sys.exit(f"wrk failed on {endpoint.path} ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return json.loads(lines[-1])


def alternating_rounds(
    port: int, endpoints: list[Endpoint], *, rounds: int, seconds: int, connections: int, threads: int = 1
) -> dict[str, Tally]:
    """`rounds` wrk rounds of each endpoint, taken in turn, so that a slow patch of a shared machine falls on each
    of them rather than on whichever endpoint happened to run then."""
    tallies = {endpoint.name: Tally() for endpoint in endpoints}
    for _round in range(rounds):
        for endpoint in endpoints:
            measured = wrk_round(port, endpoint, seconds=seconds, connections=connections, threads=threads)
            tallies[endpoint.name].add(measured)
    return tallies


def warm_up(port: int, endpoints: list[Endpoint]) -> None:
    """A second of each endpoint before measuring: worker imports, template loading, connection pools."""
    for endpoint in endpoints:
        wrk_round(port, endpoint, seconds=1, connections=2)


def check_targets(tallies: dict[str, Tally]) -> list[str]:
    """PASS or FAIL per target of issue 10; an endpoint that answered errors fails whatever its speed."""
    trivial = tallies[TRIVIAL].requests_per_second
    verdicts = []
    for name, target in TARGETS.items():
        tally = tallies[name]
        ratio = tally.requests_per_second / trivial if trivial else 0.0
        passed = ratio >= target and tally.error_count == 0 and tallies[TRIVIAL].error_count == 0
        errors = f", {tally.error_count} errors" if tally.error_count else ""
        verdicts.append(
            f"{'PASS' if passed else 'FAIL'}  {name} / trivial view = {ratio:.2f} (target >= {target}){errors}"
        )
    return verdicts


def poll_answers(tally: Tally) -> str:
    unchanged, blocks = tally.statuses[204], tally.statuses[200]
    others = sum(tally.statuses.values()) - unchanged - blocks
    return f"{unchanged} '204 unchanged', {blocks} blocks (200), {others} other answers"


class _PollingElement(html.parser.HTMLParser):
    """Finds the element htmx polls (`hx-trigger="every ..."`) and its hx-get, unescaped as a browser reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.poll_url: str | None = None
        self.element_id: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        trigger = attributes.get("hx-trigger") or ""
        if self.poll_url is None and attributes.get("hx-get") and trigger.startswith("every "):
            self.poll_url = attributes["hx-get"]
            self.element_id = attributes.get("id")


def htmx_status_poll(port: int, order_path: str) -> Endpoint:
    """The status poll as an open order page sends it: a browser GETs the page first (keeping the cookies it
    sets), then htmx polls the address the page's status block names, with the headers htmx adds. Whether the
    page already carries the current `?v=` or the first poll has to fetch a block to learn it, the poll starts
    from what the page says and wrk_round.lua follows each block's own address from there."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", order_path, headers={"Host": "127.0.0.1"})
    response = connection.getresponse()
    page = response.read().decode()
    connection.close()
    if response.status != 200:
        sys.exit(f"the order page answered {response.status}")
    cookies = [value.split(";")[0] for name, value in response.getheaders() if name.lower() == "set-cookie"]
    found = _PollingElement()
    found.feed(page)
    if found.poll_url is None:
        sys.exit("the order page has no polling status block (hx-get with hx-trigger every ...)")
    headers = {"HX-Request": "true", "HX-Current-URL": f"http://127.0.0.1:{port}{order_path}"}
    if found.element_id:
        headers |= {"HX-Target": found.element_id, "HX-Trigger": found.element_id}
    if cookies:
        headers["Cookie"] = "; ".join(cookies)
    return Endpoint(STATUS_POLL, found.poll_url, headers, follow_poll=True)
