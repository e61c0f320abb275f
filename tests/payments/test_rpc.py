"""The chain adapter facing unfriendly providers: rate limits and refused getLogs ranges (a real anvil behind a
small JSON-RPC proxy that misbehaves on purpose)."""

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from booking.models import OrderStatus
from payments import config, services
from payments.chain import ChainClient
from payments.demo import pay_invoice
from payments.selectors import current_invoice
from tests.booking.test_pages import place
from tests.payments.conftest import chains_toml


class MisbehavingProxy:
    """Forwards to anvil, except: `rate_limited` answers HTTP 429; `max_range` refuses wider eth_getLogs."""

    def __init__(self, upstream: str, *, rate_limited: bool = False, max_range: int | None = None) -> None:
        self.upstream, self.rate_limited, self.max_range = upstream, rate_limited, max_range
        self.requests = 0
        self.refused_ranges = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                proxy.requests += 1
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if proxy.rate_limited:
                    self.send_response(429)
                    self.end_headers()
                    return
                payload = json.loads(body)
                if (
                    proxy.max_range
                    and isinstance(payload, dict)
                    and payload.get("method") == "eth_getLogs"
                    and int(payload["params"][0]["toBlock"], 16) - int(payload["params"][0]["fromBlock"], 16) + 1
                    > proxy.max_range
                ):
                    proxy.refused_ranges += 1
                    answer = {
                        "jsonrpc": "2.0",
                        "id": payload["id"],
                        "error": {"code": -32005, "message": "query returned more than 10000 results"},
                    }
                    data = json.dumps(answer).encode()
                else:
                    request = urllib.request.Request(
                        proxy.upstream, data=body, headers={"Content-Type": "application/json"}
                    )
                    with urllib.request.urlopen(request, timeout=10) as response:
                        data = response.read()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxies(anvil):
    made = []

    def make(**kwargs) -> MisbehavingProxy:
        made.append(MisbehavingProxy(anvil.url, **kwargs))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()


def test_a_rate_limited_provider_is_backed_off_and_the_next_url_answers(
    client, chain, booking_data, proxies, settings, tmp_path
):
    limited = proxies(rate_limited=True)
    path = tmp_path / "limited.toml"
    path.write_text(chains_toml(limited.url, chain.chain.rpc_urls[0]))
    settings.PAYMENTS_CHAINS_FILE = str(path)
    order, _ = place(client, booking_data(lots="1"))
    pay_invoice(chain, current_invoice(order))
    chain.mine(2)

    services.chain_scan(chain_id=31337, client=ChainClient(config.chain(31337), backoff=0.01))

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    assert limited.requests >= 1  # asked first, answered 429, and the scan went on with the second URL


def test_a_refused_getlogs_range_is_shrunk_until_the_provider_accepts_it(
    client, chain, booking_data, proxies, settings, tmp_path
):
    narrow = proxies(max_range=16)
    path = tmp_path / "narrow.toml"
    path.write_text(chains_toml(narrow.url))
    settings.PAYMENTS_CHAINS_FILE = str(path)
    order, _ = place(client, booking_data(lots="1"))
    chain.mine(40)  # a range wider than the provider accepts
    pay_invoice(chain, current_invoice(order))
    chain.mine(2)

    services.chain_scan(chain_id=31337)

    order.refresh_from_db()
    assert order.status == OrderStatus.PAID
    assert narrow.refused_ranges >= 1
