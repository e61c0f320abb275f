"""A JSON-RPC proxy in front of anvil that behaves like a hosted provider: it enforces the limits of common
providers (geth's defaults: 1,000 topics per filter, batches of 1,000 calls, 10,000 logs per eth_getLogs answer;
an optional block-range cap), and on demand answers rate limits (HTTP 429 or JSON-RPC -32005), garbage, or a
lagging head. It counts requests and bytes per method, for the tests and bench/chain_scan.py.

It binds 127.0.0.1 on a free port; `close()` stops it."""

import json
import threading
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RATE_LIMIT_RPC = {"code": -32005, "message": "daily request count exceeded, request rate limited"}


def _error(request_id, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


class LimitingProxy:
    def __init__(
        self,
        upstream: str,
        *,
        max_range: int | None = None,
        max_logs: int = 10_000,
        max_batch: int = 1_000,
        max_topics: int = 1_000,
        rate_limit: str | None = None,  # "http": HTTP 429; "rpc": JSON-RPC -32005; None: serve
        rate_limit_methods: frozenset[str] | None = None,  # only these methods are limited (None: all)
        garbage: bool = False,  # answer HTTP 200 with a body that is not JSON-RPC
        lag: int = 0,  # serve a head this many blocks behind the real one
        stale_log_hashes: int = 0,  # this many eth_getLogs answers carry a block hash that is not canonical
        unknown_methods: frozenset[str] = frozenset(),  # answered -32601 "method not found", like an older node
        logs_lag: int = 0,  # requests with eth_getLogs reach a backend this many blocks behind (load balancing)
        logs_lag_error: str | None = None,  # how that backend refuses a range beyond its head (None: clamps it)
        split_batches: bool = False,  # a batch's calls are spread over backends: only its logs reach the lagging one
    ) -> None:
        self.split_batches = split_batches
        self.logs_lag, self.logs_lag_error = logs_lag, logs_lag_error
        self.unknown_methods = unknown_methods
        self.stale_log_hashes = stale_log_hashes
        self.upstream = upstream
        self.max_range, self.max_logs, self.max_batch, self.max_topics = max_range, max_logs, max_batch, max_topics
        self.rate_limit, self.rate_limit_methods, self.garbage, self.lag = rate_limit, rate_limit_methods, garbage, lag
        self.requests = 0  # HTTP requests (a batch is one)
        self.calls = Counter()  # JSON-RPC calls per method
        self.full_blocks = 0  # eth_getBlockByNumber calls asking for the transactions (not headers only)
        self.bytes_in = 0
        self.bytes_out = 0
        self.refused = Counter()  # why calls were refused
        self.log_queries: list[dict] = []  # every eth_getLogs filter received
        self.largest_request = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status, data = proxy._answer(body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                with proxy._lock:
                    proxy.bytes_out += len(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reset_counts(self) -> None:
        with self._lock:
            self.requests, self.bytes_in, self.bytes_out, self.largest_request = 0, 0, 0, 0
            self.calls.clear()
            self.full_blocks = 0
            self.refused.clear()
            self.log_queries.clear()

    # --- answering ---------------------------------------------------------------------------------------------
    def _upstream(self, payload) -> object:
        request = urllib.request.Request(
            self.upstream, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def _answer(self, body: bytes) -> tuple[int, bytes]:
        with self._lock:
            self.requests += 1
            self.bytes_in += len(body)
            self.largest_request = max(self.largest_request, len(body))
        if self.garbage:
            return 200, b"<html>502 Bad Gateway</html>"
        payload = json.loads(body)
        calls = payload if isinstance(payload, list) else [payload]
        with self._lock:
            self.calls.update(call.get("method", "?") for call in calls)
            self.full_blocks += sum(
                1
                for call in calls
                if call.get("method") == "eth_getBlockByNumber" and (call.get("params") or [None, False])[-1] is True
            )
        if self.rate_limit == "http" and self._limited(calls):
            self.refused["http 429"] += 1
            return 429, b'{"message": "Too Many Requests"}'
        if isinstance(payload, list):
            if len(payload) > self.max_batch:
                self.refused["batch too large"] += 1
                return 200, json.dumps(_error(None, -32600, f"batch too large (max {self.max_batch})")).encode()
            if self._plain(payload):  # nothing to check or change call by call: one round trip upstream
                return 200, json.dumps(self._upstream_batch(payload)).encode()
            if self.split_batches:
                return 200, json.dumps([self._one(call, self._lag_for([call])) for call in payload]).encode()
            lag = self._lag_for(payload)
            return 200, json.dumps([self._one(call, lag) for call in payload]).encode()
        return 200, json.dumps(self._one(payload, self._lag_for([payload]))).encode()

    def _lag_for(self, calls: list) -> int:
        """How far behind the backend that serves these calls is: a request asking for logs may reach a lagging
        backend of the load balancer, while the others reach an up-to-date one."""
        if self.logs_lag and any(isinstance(call, dict) and call.get("method") == "eth_getLogs" for call in calls):
            return self.logs_lag
        return self.lag

    def _plain(self, calls: list) -> bool:
        return (
            not self.lag
            and not self.logs_lag
            and self.rate_limit is None
            and not self.unknown_methods
            and all(isinstance(call, dict) and call.get("method") != "eth_getLogs" for call in calls)
        )

    def _upstream_batch(self, calls: list) -> list:
        answers = self._upstream(calls)
        by_id = {answer.get("id"): answer for answer in answers} if isinstance(answers, list) else {}
        return [by_id.get(call.get("id"), _error(call.get("id"), -32603, "no answer upstream")) for call in calls]

    def _limited(self, calls: list) -> bool:
        return self.rate_limit_methods is None or any(call.get("method") in self.rate_limit_methods for call in calls)

    def _head(self) -> int:
        return int(self._upstream({"jsonrpc": "2.0", "id": 0, "method": "eth_blockNumber", "params": []})["result"], 16)

    def _one(self, call: dict, lag: int = 0) -> dict:
        method, params, request_id = call.get("method"), call.get("params", []), call.get("id")
        if method == "eth_getLogs":
            self.log_queries.append(params[0])
        if method in self.unknown_methods:
            self.refused["unknown method"] += 1
            return _error(request_id, -32601, f"the method {method} does not exist/is not available")
        if self.rate_limit == "rpc" and self._limited([call]):
            self.refused["rpc -32005"] += 1
            return {"jsonrpc": "2.0", "id": request_id, "error": RATE_LIMIT_RPC}
        if method == "eth_getLogs":
            query = params[0]
            topics = [
                topic
                for position in query.get("topics", [])
                for topic in (position if isinstance(position, list) else [position])
            ]
            if len(topics) > self.max_topics:
                self.refused["too many topics"] += 1
                return _error(request_id, -32602, f"too many topics (max {self.max_topics})")
            span = int(query["toBlock"], 16) - int(query["fromBlock"], 16) + 1
            if self.max_range and span > self.max_range:
                self.refused["range"] += 1
                return _error(request_id, -32602, f"block range is too wide (max {self.max_range} blocks)")
        if lag:
            head = max(0, self._head() - lag)
            if method == "eth_blockNumber":
                return {"jsonrpc": "2.0", "id": request_id, "result": hex(head)}
            if method in ("eth_getBlockByNumber", "eth_getBalance", "eth_getTransactionCount", "eth_call"):
                position = 0 if method == "eth_getBlockByNumber" else 1
                at = params[position] if len(params) > position else "latest"
                if isinstance(at, str) and at.startswith("0x") and int(at, 16) > head:
                    if method != "eth_getBlockByNumber":
                        return _error(request_id, -32000, "header not found")
                    return {"jsonrpc": "2.0", "id": request_id, "result": None}  # a block it does not have
            if method == "eth_getLogs" and int(params[0]["toBlock"], 16) > head and self.logs_lag_error:
                self.refused["beyond head"] += 1
                return _error(request_id, -32602, self.logs_lag_error.format(head=head))
            if method == "eth_getLogs" and int(params[0]["toBlock"], 16) > head:
                self.refused["clamped"] += 1
                params = [{**params[0], "toBlock": hex(head)}]  # like geth: silently up to its own head
        answer = self._upstream({**call, "params": params})
        if method == "eth_getLogs" and self.stale_log_hashes and answer.get("result"):
            self.stale_log_hashes -= 1
            answer["result"] = [{**log, "blockHash": "0x" + "ab" * 32} for log in answer["result"]]
        if method == "eth_getLogs" and isinstance(answer.get("result"), list) and len(answer["result"]) > self.max_logs:
            self.refused["too many results"] += 1
            return _error(request_id, -32005, f"query returned more than {self.max_logs} results")
        return answer
