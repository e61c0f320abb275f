"""deploy/nginx.conf, run by Debian's nginx in front of a stand-in for gunicorn: the config is valid for nginx
itself (`nginx -t`), the proxy is the edge for X-Forwarded-Proto, POSTs and open connections are limited per client,
and neither of its logs carries an order's token when the upstream fails on an order page.

Only two things differ from docker-compose.yml: the listening port and the upstream's address (`web:8000`, a
name only the compose network resolves), replaced by free loopback ports."""

import http.client
import http.server
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.payments.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "Zm9yLXRlc3RzLW9ubHktYS1zZWNyZXQtdG9rZW4"  # an order link's secret, as booking/tokens.py makes them
ORDER_PATH = f"/orders/BN-7Q2K9XWD/{TOKEN}/"


class Upstream(http.server.ThreadingHTTPServer):
    """Stands in for gunicorn: records the headers it receives; /slow answers after a while, and an order page
    drops the connection without an answer (a worker killed mid-request: nginx logs an upstream error)."""

    daemon_threads = True

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self) -> None:
                upstream.seen.append({name.lower(): value for name, value in self.headers.items()})
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if self.path.startswith("/orders/"):
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                if self.path == "/slow":
                    time.sleep(2)
                body = b"ok"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        super().__init__(("127.0.0.1", free_port()), Handler)


@pytest.fixture
def nginx(tmp_path):
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        pytest.fail("nginx is missing: make system-deps installs Debian's nginx", pytrace=False)
    upstream = Upstream()
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = free_port()
    site = (ROOT / "deploy" / "nginx.conf").read_text()
    assert "proxy_pass http://web:8000;" in site and "listen 8000;" in site
    site = site.replace("proxy_pass http://web:8000;", f"proxy_pass http://127.0.0.1:{upstream.server_address[1]};")
    site = site.replace("listen 8000;", f"listen 127.0.0.1:{port};")
    (tmp_path / "site.conf").write_text(site)
    # What the nginx image's own nginx.conf holds around conf.d/*.conf, with its files in tmp_path.
    (tmp_path / "nginx.conf").write_text(
        f"""
        user root;
        worker_processes 1;
        pid {tmp_path}/nginx.pid;
        error_log {tmp_path}/main-error.log notice;
        events {{ worker_connections 256; }}
        http {{
            client_body_temp_path {tmp_path}/body;
            proxy_temp_path {tmp_path}/proxy;
            fastcgi_temp_path {tmp_path}/fastcgi;
            uwsgi_temp_path {tmp_path}/uwsgi;
            scgi_temp_path {tmp_path}/scgi;
            include {tmp_path}/site.conf;
        }}
        """
    )
    checked = subprocess.run(
        [binary, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr
    access_log, error_log = (tmp_path / "stdout.log").open("wb"), (tmp_path / "stderr.log").open("wb")
    process = subprocess.Popen(
        [binary, "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-g", "daemon off;"],
        stdout=access_log,
        stderr=error_log,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=2).connect()
            break
        except OSError:
            assert process.poll() is None, (tmp_path / "main-error.log").read_text()
            assert time.monotonic() < deadline, "nginx did not start"
            time.sleep(0.05)

    class Running:
        pass

    running = Running()
    running.port, running.upstream, running.folder = port, upstream, tmp_path
    yield running
    process.terminate()
    process.wait(timeout=10)
    upstream.shutdown()
    access_log.close()
    error_log.close()


def _request(port: int, method: str, path: str, headers: dict | None = None, body: str | None = None) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(method, path, body=body, headers={"Host": "localhost", **(headers or {})})
    status = connection.getresponse().status
    connection.close()
    return status


def test_the_proxy_tells_gunicorn_its_own_scheme_not_the_client_s(nginx):
    assert _request(nginx.port, "GET", "/", headers={"X-Forwarded-Proto": "https"}) == 200

    headers = nginx.upstream.seen[-1]
    assert headers["x-forwarded-proto"] == "http"  # reached over plain http: the client's claim is replaced
    assert headers["x-forwarded-for"] == "127.0.0.1"


def test_a_burst_of_posts_from_one_client_is_cut_but_its_pages_and_polls_are_not(nginx):
    posts = [_request(nginx.port, "POST", "/book/", body="lots=1") for _ in range(40)]
    gets = [_request(nginx.port, "GET", "/book/") for _ in range(40)]

    assert posts[:21] == [200] * 21  # one, then the burst of 20
    assert posts.count(429) >= 15
    assert gets == [200] * 40


def test_one_client_cannot_hold_more_than_twenty_connections(nginx):
    with ThreadPoolExecutor(max_workers=30) as pool:
        statuses = list(pool.map(lambda _: _request(nginx.port, "GET", "/slow"), range(30)))

    assert statuses.count(200) <= 20 and statuses.count(429) >= 10


def test_an_upstream_failure_on_an_order_page_logs_no_token(nginx):
    assert _request(nginx.port, "GET", ORDER_PATH) == 502
    assert _request(nginx.port, "POST", ORDER_PATH + "cancel/", body="x=1") == 502
    time.sleep(0.2)  # nginx writes its logs unbuffered, but after answering

    logs = {path.name: path.read_text() for path in nginx.folder.glob("*.log")}
    assert '"GET /orders/BN-7Q2K9XWD/[token]/" 502' in logs["stdout.log"]
    assert "upstream=502@127.0.0.1" in logs["stdout.log"]  # what the error log would have said
    assert '"POST /orders/BN-7Q2K9XWD/[token]/cancel/" 502' in logs["stdout.log"]
    assert all(TOKEN not in text for text in logs.values()), logs
