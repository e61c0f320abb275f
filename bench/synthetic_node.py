"""A JSON-RPC node that makes up a chain of realistic blocks (150 transactions each, about 900 bytes of JSON per
transaction, as on Ethereum mainnet), for bench/chain_scan.py: anvil cannot mine the million transactions of a
7,200-block catch-up on a small machine. It answers what the scanner asks (eth_chainId, eth_blockNumber,
eth_getBlockByNumber with or without transactions, eth_getLogs, balances) and counts requests and bytes.

    python bench/synthetic_node.py PORT_FILE [CHAIN_ID] [HEAD]

Bench-only methods (not counted): bench_counts, bench_reset, bench_setHead [number], bench_reorg [number] (every
block from that number on gets another hash).
"""

import hashlib
import json
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TRANSACTIONS_PER_BLOCK = 150
ZERO = "0x" + "00" * 32


class Chain:
    def __init__(self, chain_id: int, head: int) -> None:
        self.chain_id, self.head = chain_id, head
        self.reorgs: list[int] = []  # the first block each reorganisation replaced
        self.lock = threading.Lock()
        self.requests, self.bytes_in, self.bytes_out, self.largest_request = 0, 0, 0, 0
        self.calls: Counter = Counter()

    def block_hash(self, number: int) -> str:
        salt = sum(1 for first in self.reorgs if number >= first)
        return "0x" + hashlib.sha256(f"block:{salt}:{number}".encode()).hexdigest()

    def tx_hash(self, number: int, index: int) -> str:
        return "0x" + hashlib.sha256(f"tx:{number}:{index}".encode()).hexdigest()

    def block(self, number: int, full: bool) -> str:
        if number > self.head:
            return "null"
        block_hash = self.block_hash(number)
        if full:
            txs = ",".join(self._transaction(number, block_hash, index) for index in range(TRANSACTIONS_PER_BLOCK))
        else:
            txs = ",".join(f'"{self.tx_hash(number, index)}"' for index in range(TRANSACTIONS_PER_BLOCK))
        bloom = "0x" + "00" * 256
        return (
            f'{{"number":"{hex(number)}","hash":"{block_hash}","parentHash":"{self.block_hash(number - 1)}",'
            f'"timestamp":"{hex(1_700_000_000 + 12 * number)}","nonce":"0x0000000000000000",'
            f'"sha3Uncles":"{ZERO}","logsBloom":"{bloom}","transactionsRoot":"{ZERO}","stateRoot":"{ZERO}",'
            f'"receiptsRoot":"{ZERO}","miner":"0x95222290dd7278aa3ddd389cc1e1d165cc4bafe5","difficulty":"0x0",'
            f'"totalDifficulty":"0xc70d815d562d3cfa955","extraData":"0x6265617665726275696c642e6f7267",'
            f'"size":"0x2a9b1","gasLimit":"0x1c9c380","gasUsed":"0xe4e1c0","baseFeePerGas":"0x5d21dba00",'
            f'"withdrawalsRoot":"{ZERO}","blobGasUsed":"0x0","excessBlobGas":"0x0",'
            f'"parentBeaconBlockRoot":"{ZERO}","mixHash":"{ZERO}","uncles":[],"withdrawals":[],'
            f'"transactions":[{txs}]}}'
        )

    def _transaction(self, number: int, block_hash: str, index: int) -> str:
        sender = "0x" + hashlib.sha256(f"from:{index}".encode()).hexdigest()[:40]
        recipient = "0x" + hashlib.sha256(f"to:{number}:{index}".encode()).hexdigest()[:40]
        data = "0xa9059cbb" + "00" * 12 + recipient[2:] + "00" * 28 + "3b9aca00"  # an ERC-20 transfer call
        return (
            f'{{"blockHash":"{block_hash}","blockNumber":"{hex(number)}","from":"{sender}","gas":"0x186a0",'
            f'"gasPrice":"0x6fc23ac00","maxFeePerGas":"0xba43b7400","maxPriorityFeePerGas":"0x3b9aca00",'
            f'"hash":"{self.tx_hash(number, index)}","input":"{data}","nonce":"{hex(index * 7)}","to":"{recipient}",'
            f'"transactionIndex":"{hex(index)}","value":"0x0","type":"0x2","accessList":[],'
            f'"chainId":"{hex(self.chain_id)}","v":"0x1","yParity":"0x1",'
            f'"r":"0x{"1f" * 32}","s":"0x{"2e" * 32}"}}'
        )

    def answer(self, call: dict) -> str:
        method, params, request_id = call.get("method"), call.get("params") or [], json.dumps(call.get("id"))
        if method == "eth_chainId":
            result = f'"{hex(self.chain_id)}"'
        elif method == "eth_blockNumber":
            result = f'"{hex(self.head)}"'
        elif method == "eth_getBlockByNumber":
            tag = params[0]
            number = self.head if tag in ("latest", "finalized", "safe") else int(tag, 16)
            result = self.block(number, bool(params[1]))
        elif method == "eth_getLogs":
            result = "[]"
        elif method in ("eth_getBalance", "eth_getTransactionCount"):
            result = '"0x0"'
        elif method == "eth_call":
            result = f'"{ZERO}"'
        elif method == "eth_getBlockReceipts":
            result = "[]"
        else:
            return f'{{"jsonrpc":"2.0","id":{request_id},"error":{{"code":-32601,"message":"method not found"}}}}'
        return f'{{"jsonrpc":"2.0","id":{request_id},"result":{result}}}'

    def control(self, call: dict) -> str | None:
        method, params = call.get("method"), call.get("params") or []
        if method == "bench_counts":
            result = json.dumps(
                {
                    "requests": self.requests,
                    "bytes_in": self.bytes_in,
                    "bytes_out": self.bytes_out,
                    "largest_request": self.largest_request,
                    "calls": dict(self.calls),
                }
            )
        elif method == "bench_reset":
            self.requests, self.bytes_in, self.bytes_out, self.largest_request = 0, 0, 0, 0
            self.calls.clear()
            result = "true"
        elif method == "bench_setHead":
            self.head = int(params[0])
            result = "true"
        elif method == "bench_reorg":
            self.reorgs.append(int(params[0]))
            result = "true"
        else:
            return None
        return f'{{"jsonrpc":"2.0","id":{json.dumps(call.get("id"))},"result":{result}}}'


def serve(port_file: str, chain_id: int, head: int) -> None:
    chain = Chain(chain_id, head)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            payload = json.loads(body)
            controlled = chain.control(payload) if isinstance(payload, dict) else None
            if controlled is not None:
                answer = controlled.encode()
            else:
                calls = payload if isinstance(payload, list) else [payload]
                parts = [chain.answer(call) for call in calls]
                answer = ("[" + ",".join(parts) + "]" if isinstance(payload, list) else parts[0]).encode()
                with chain.lock:
                    chain.requests += 1
                    chain.bytes_in += len(body)
                    chain.bytes_out += len(answer)
                    chain.largest_request = max(chain.largest_request, len(body))
                    chain.calls.update(call.get("method", "?") for call in calls)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(port_file, "w") as file:
        file.write(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 31337, int(sys.argv[3]) if len(sys.argv) > 3 else 0)
