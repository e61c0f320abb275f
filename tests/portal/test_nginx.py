"""The proxy as docker-compose.yml runs it: deploy/proxy writes its part of the configuration, then Debian's nginx
runs deploy/nginx.conf (with deploy/nginx/'s files) in front of a stand-in for gunicorn. The config is valid for
nginx itself (`nginx -t`), the proxy is the edge for X-Forwarded-Proto, POSTs and open connections are limited per
client, neither of its logs carries an order's token when the upstream fails on an order page, HTTPS is served with
the operator's certificate (a local CA's here) and plain http redirects to it but for ACME's challenges, no
certificate means no portal over plain http unless asked for, and a new address of `web` is followed.

What differs from docker-compose.yml is given to deploy/proxy as the compose file could: the listening addresses
and the upstream (free loopback ports), the folders (the test's own), the DNS server (the test's own)."""

import http.client
import http.server
import os
import shutil
import socket
import socketserver
import ssl
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.builders.tls import certificate_authority, local_ca
from tests.payments.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "Zm9yLXRlc3RzLW9ubHktYS1zZWNyZXQtdG9rZW4"  # an order link's secret, as booking/tokens.py makes them
ORDER_PATH = f"/orders/BN-7Q2K9XWD/{TOKEN}/"


class Upstream(http.server.ThreadingHTTPServer):
    """Stands in for gunicorn: records the headers it receives; /slow answers after a while, and an order page
    drops the connection without an answer (a worker killed mid-request: nginx logs an upstream error)."""

    daemon_threads = True

    def __init__(self, address: str = "127.0.0.1", port: int | None = None) -> None:
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
                body = f"ok from {address}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        super().__init__((address, port or free_port()), Handler)


@pytest.fixture
def start_proxy(tmp_path):
    """Runs deploy/proxy, then nginx on what it wrote; returns the running proxy. Stopped at the test's end."""
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if binary is None:
        pytest.fail("nginx is missing: make system-deps installs Debian's nginx", pytrace=False)
    started: list[tuple[subprocess.Popen, Upstream, list]] = []

    def start(*, upstream: str = "127.0.0.1:{port}", folder: Path | None = None, **environment: str) -> Proxy:
        """`upstream`: PROXY_UPSTREAM, `{port}` standing for the stand-in's port."""
        folder = folder or tmp_path
        folder.mkdir(exist_ok=True)
        stand_in = Upstream()
        threading.Thread(target=stand_in.serve_forever, daemon=True).start()
        port, tls_port = free_port(), free_port()
        # The image's /etc/nginx: deploy/nginx/ at binome/ (the ACME folder moved to the test's), and nginx.conf.
        shutil.copytree(ROOT / "deploy" / "nginx", folder / "binome", dirs_exist_ok=True)
        acme_conf = folder / "binome" / "acme.conf"
        assert "root /var/www/acme;" in acme_conf.read_text()
        acme_conf.write_text(acme_conf.read_text().replace("/var/www/acme", str(folder / "acme")))
        # What the nginx image's own nginx.conf holds around conf.d/*.conf, with its files in `folder`.
        (folder / "nginx.conf").write_text(
            f"""
            user root;
            worker_processes 1;
            pid {folder}/nginx.pid;
            error_log {folder}/main-error.log notice;
            events {{ worker_connections 256; }}
            http {{
                client_body_temp_path {folder}/body;
                proxy_temp_path {folder}/proxy;
                fastcgi_temp_path {folder}/fastcgi;
                uwsgi_temp_path {folder}/uwsgi;
                scgi_temp_path {folder}/scgi;
                include {ROOT}/deploy/nginx.conf;
            }}
            """
        )
        written = subprocess.run(
            ["sh", str(ROOT / "deploy" / "proxy"), "true"],
            env={
                "PATH": os.environ["PATH"],
                "PROXY_CONF_DIR": str(folder),
                "PROXY_TLS_DIR": str(folder / "tls"),
                "PROXY_UPSTREAM": upstream.format(port=stand_in.server_address[1]),
                "PROXY_LISTEN_HTTP": f"127.0.0.1:{port}",
                "PROXY_LISTEN_HTTPS": f"127.0.0.1:{tls_port}",
                "PROXY_TLS_PORT": str(tls_port),
                **environment,
            },
            capture_output=True,
            text=True,
        )
        proxy = Proxy(port, tls_port, stand_in, folder, written)
        if written.returncode != 0:
            stand_in.shutdown()
            return proxy
        command = [binary, "-p", str(folder), "-c", str(folder / "nginx.conf")]
        checked = subprocess.run([*command, "-t"], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        access_log, error_log = (folder / "stdout.log").open("wb"), (folder / "stderr.log").open("wb")
        process = subprocess.Popen(
            [*command, "-g", "daemon off;"], stdout=access_log, stderr=error_log, start_new_session=True
        )
        started.append((process, stand_in, [access_log, error_log]))
        deadline = time.monotonic() + 10
        while True:
            try:
                http.client.HTTPConnection("127.0.0.1", port, timeout=2).connect()
                return proxy
            except OSError:
                assert process.poll() is None, (folder / "main-error.log").read_text()
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.05)

    yield start
    for process, stand_in, logs in started:
        process.terminate()
        process.wait(timeout=10)
        stand_in.shutdown()
        for log in logs:
            log.close()


@dataclass
class Proxy:
    port: int
    tls_port: int
    upstream: "Upstream"
    folder: Path
    start: subprocess.CompletedProcess  # deploy/proxy's run


@pytest.fixture
def nginx(start_proxy):
    """The proxy on plain http (PROXY_PLAIN_HTTP=1), as a lab on its own network runs it."""
    return start_proxy(PROXY_PLAIN_HTTP="1")


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


def _https(port: int, path: str, ca: Path) -> tuple[int, dict, str]:
    tls = ssl.create_default_context(cafile=str(ca))
    connection = http.client.HTTPSConnection("localhost", port, context=tls, timeout=10)
    connection.request("GET", path)
    response = connection.getresponse()
    answer = response.status, dict(response.headers), response.read().decode()
    connection.close()
    return answer


def test_with_the_operator_s_certificate_the_portal_is_served_over_https_and_plain_http_redirects(
    start_proxy, tmp_path
):
    ca = local_ca(tmp_path)
    (tmp_path / "acme" / ".well-known" / "acme-challenge").mkdir(parents=True)
    (tmp_path / "acme" / ".well-known" / "acme-challenge" / "Zx9-token").write_text("Zx9-token.thumbprint")
    (tmp_path / "acme" / "secret.txt").write_text("not for the web")

    proxy = start_proxy()

    status, _headers, body = _https(proxy.tls_port, "/book/", ca)
    assert (status, body) == (200, "ok from 127.0.0.1")
    assert proxy.upstream.seen[-1]["x-forwarded-proto"] == "https"
    # curl, as docs/operations.md has the operator check it, trusting only the local CA
    curl = subprocess.run(
        ["curl", "-sS", "--cacert", str(ca), "-o", "/dev/null", "-w", "%{http_code} %{ssl_verify_result}",
         "--resolve", f"localhost:{proxy.tls_port}:127.0.0.1", f"https://localhost:{proxy.tls_port}/"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert curl.stdout == "200 0", curl.stderr
    # a client that does not trust that CA is refused (it is the certificate that is served, not a default one)
    with pytest.raises(ssl.SSLCertVerificationError):
        _https(proxy.tls_port, "/", certificate_authority(tmp_path, "another-ca"))
    plain = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    plain.request("POST", ORDER_PATH + "paid/?x=1", body="a=1", headers={"Host": "localhost"})
    redirect = plain.getresponse()
    assert redirect.status == 308  # a POST stays a POST
    assert redirect.headers["Location"] == f"https://localhost:{proxy.tls_port}{ORDER_PATH}paid/?x=1"
    assert _request(proxy.port, "GET", "/.well-known/acme-challenge/Zx9-token") == 200
    assert _request(proxy.port, "GET", "/.well-known/acme-challenge/../secret.txt") == 308  # /secret.txt: not served
    assert _request(proxy.port, "GET", "/.well-known/acme-challenge/missing") == 404
    assert len(proxy.upstream.seen) == 2  # neither the redirect nor the challenges reached the portal


def test_plain_http_redirects_to_the_portal_s_own_address_whatever_host_the_client_names(start_proxy, tmp_path):
    local_ca(tmp_path)
    proxy = start_proxy(PROXY_SITE_URL="https://book.example.org")

    for host in ("evil.example", "book.example.org"):
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        connection.request("GET", "/book/?lots=2", headers={"Host": host})
        answer = connection.getresponse()
        assert (answer.status, answer.headers["Location"]) == (308, "https://book.example.org/book/?lots=2"), host


def test_without_a_certificate_plain_http_serves_challenges_only_unless_asked_to_serve_the_portal(
    start_proxy, tmp_path
):
    (tmp_path / "acme" / ".well-known" / "acme-challenge").mkdir(parents=True)
    (tmp_path / "acme" / ".well-known" / "acme-challenge" / "first").write_text("first.thumbprint")

    proxy = start_proxy()

    assert "no certificate in" in proxy.start.stderr and "PROXY_PLAIN_HTTP=1" in proxy.start.stderr
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    connection.request("GET", "/book/", headers={"Host": "localhost"})
    answer = connection.getresponse()
    assert answer.status == 503 and b"no TLS certificate yet" in answer.read()
    assert _request(proxy.port, "GET", "/.well-known/acme-challenge/first") == 200  # certbot can get the first one
    assert proxy.upstream.seen == []


@pytest.mark.parametrize(
    ("environment", "files", "message"),
    [
        ({}, ["fullchain.pem"], "needs both fullchain.pem and privkey.pem"),
        ({}, ["privkey.pem"], "needs both fullchain.pem and privkey.pem"),
        ({"PROXY_UPSTREAM": "web:8000; include /etc/shadow"}, [], "PROXY_UPSTREAM is not host:port"),
        ({"PROXY_UPSTREAM": "web"}, [], "PROXY_UPSTREAM is not host:port"),
        ({"PROXY_LISTEN_HTTPS": "8443 ssl; root /"}, [], "PROXY_LISTEN_HTTPS is not a port"),
        ({"PROXY_TLS_PORT": "443$request_uri"}, [], "PROXY_TLS_PORT is not a port"),
        ({"PROXY_RELOAD_HOURS": "0"}, [], "PROXY_RELOAD_HOURS is not a whole number"),
        ({"PROXY_PLAIN_HTTP": "yes"}, [], "PROXY_PLAIN_HTTP is 0 or 1"),
        ({"PROXY_SITE_URL": "https://x/; return 200 y"}, ["fullchain.pem", "privkey.pem"], "PROXY_SITE_URL is not"),
        ({"PROXY_RESOLVER": "127.0.0.1; include x", "PROXY_UPSTREAM": "web:1"}, [], "PROXY_RESOLVER holds more"),
    ],
)
def test_the_proxy_does_not_start_on_half_a_certificate_or_a_setting_nginx_would_misread(
    start_proxy, tmp_path, environment, files, message
):
    (tmp_path / "tls").mkdir()
    for name in files:
        (tmp_path / "tls" / name).write_text("-----BEGIN CERTIFICATE-----\n")

    proxy = start_proxy(**environment)

    assert proxy.start.returncode == 1 and message in proxy.start.stderr, proxy.start.stderr
    assert not (tmp_path / "binome-run" / "servers.conf").exists()


class Names(socketserver.BaseRequestHandler):
    """A DNS server of the test's own (UDP): `web` is whatever address `Names.web` holds now; no IPv6 address."""

    web = "127.0.0.1"
    asked = 0

    def handle(self) -> None:
        query, sock = self.request
        ident, question_end = query[:2], 12
        while query[question_end]:
            question_end += query[question_end] + 1
        question, name = query[12 : question_end + 5], query[12:question_end]
        kind = int.from_bytes(query[question_end + 1 : question_end + 3], "big")
        answers = b""
        if name == b"\x03web" and kind == 1:
            Names.asked += 1
            answers = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 1, 4) + socket.inet_aton(Names.web)
        flags = b"\x81\x80" if name == b"\x03web" else b"\x81\x83"  # an answer, or no such name
        header = ident + flags + struct.pack(">HHHH", 1, 1 if answers else 0, 0, 0)
        sock.sendto(header + question + answers, self.client_address)


def _body(port: int, path: str) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", path, headers={"Host": "localhost"})
    body = connection.getresponse().read().decode()
    connection.close()
    return body


def test_a_new_address_of_web_is_followed_without_restarting_the_proxy(start_proxy):
    # given: the proxy on the name `web` (as in compose), which the DNS server says is 127.0.0.1
    dns = socketserver.ThreadingUDPServer(("127.0.0.1", 0), Names)
    threading.Thread(target=dns.serve_forever, daemon=True).start()
    Names.web, Names.asked = "127.0.0.1", 0
    proxy = start_proxy(
        upstream="web:{port}", PROXY_PLAIN_HTTP="1", PROXY_RESOLVER=f"127.0.0.1:{dns.server_address[1]}"
    )
    recreated = Upstream("127.0.0.2", proxy.upstream.server_address[1])  # web's container, recreated elsewhere
    threading.Thread(target=recreated.serve_forever, daemon=True).start()
    assert _body(proxy.port, "/") == "ok from 127.0.0.1"

    # when: web is recreated with a new address
    Names.web = "127.0.0.2"
    started, bodies = time.monotonic(), []
    while time.monotonic() - started < 20 and "ok from 127.0.0.2" not in bodies:
        bodies.append(_body(proxy.port, "/"))
        time.sleep(0.25)

    # then: within the resolver's 10 s the proxy reaches the new one, and no request failed meanwhile
    assert bodies[-1] == "ok from 127.0.0.2", bodies[-3:]
    assert set(bodies) == {"ok from 127.0.0.1", "ok from 127.0.0.2"}
    assert Names.asked >= 2
    recreated.shutdown()
    dns.shutdown()
