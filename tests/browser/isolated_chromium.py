#!/usr/bin/env python3
"""Debian's Chromium in a network namespace of its own, reaching this machine's loopback through a SOCKS5 relay.

Playwright starts this file as the browser's executable. Chromium watches the network interfaces it can see, and a
request in flight when an address or a link changes fails with net::ERR_NETWORK_CHANGED. The host's tests create
and remove bridges, veths, namespaces and addresses all the time (podman, netavark, the outside server) while the
browser's tests run beside them on other workers; in its own namespace, with only `lo`, the browser sees none of
that. Its one way out is the relay below: a process that listens on the namespace's 127.0.0.1 and connects on the
host's loopback (a socket belongs to the namespace it was made in), to loopback addresses only. Every name resolves
to 127.0.0.1, as the tests' `--host-resolver-rules` say: the browser's whole world is this machine's servers.

Only the standard library: it runs with whichever python3 is on the PATH, before any virtual environment.
"""

import ctypes
import fcntl
import ipaddress
import os
import signal
import socket
import struct
import sys
import threading
from contextlib import suppress

CHROMIUM = "/usr/bin/chromium"
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
CONNECT_TIMEOUT_S = 10

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(probe, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


def _exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the browser closed the connection during the SOCKS greeting")
        data += chunk
    return data


def _destination(client: socket.socket) -> tuple[str, int] | None:
    """RFC 1928's greeting and CONNECT request: the (loopback address, port) asked for, or None (answered)."""
    version, count = _exactly(client, 2)
    methods = _exactly(client, count)
    if version != 5 or 0 not in methods:
        client.sendall(b"\x05\xff")
        return None
    client.sendall(b"\x05\x00")
    version, command, _reserved, kind = _exactly(client, 4)
    if kind == 1:
        host = socket.inet_ntop(socket.AF_INET, _exactly(client, 4))
    elif kind == 4:
        host = socket.inet_ntop(socket.AF_INET6, _exactly(client, 16))
    elif kind == 3:
        _exactly(client, _exactly(client, 1)[0])  # any name: this machine
        host = "127.0.0.1"
    else:
        client.sendall(b"\x05\x08\x00\x01" + bytes(6))  # address type not supported
        return None
    (port,) = struct.unpack("!H", _exactly(client, 2))
    if version != 5 or command != 1:
        client.sendall(b"\x05\x07\x00\x01" + bytes(6))  # command not supported
        return None
    if not ipaddress.ip_address(host).is_loopback:
        client.sendall(b"\x05\x02\x00\x01" + bytes(6))  # not allowed: nothing but this machine
        return None
    return host, port


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        with suppress(OSError):
            target.shutdown(socket.SHUT_WR)


def _relay(client: socket.socket) -> None:
    with client:
        try:
            destination = _destination(client)
            if destination is None:
                return
            try:
                upstream = socket.create_connection(destination, timeout=CONNECT_TIMEOUT_S)
            except OSError:
                client.sendall(b"\x05\x05\x00\x01" + bytes(6))  # connection refused
                return
        except (OSError, ValueError):
            return
        with upstream:
            upstream.settimeout(None)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client.sendall(b"\x05\x00\x00\x01" + bytes(6))
            back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
            back.start()
            _pump(client, upstream)
            back.join()


def _serve(listener: socket.socket, browser: int) -> None:
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl")
    if os.getppid() != browser:  # the browser is already gone
        os._exit(0)
    while True:
        client, _ = listener.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_relay, args=(client,), daemon=True).start()


def main(arguments: list[str]) -> None:
    host_namespace = os.open("/proc/self/ns/net", os.O_RDONLY)
    _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    _loopback_up()
    listener = socket.create_server(("127.0.0.1", 0), backlog=256)
    port = listener.getsockname()[1]
    browser = os.getpid()
    if os.fork() == 0:  # the relay: its listening socket stays in the browser's namespace, its connections not
        keep = sorted({listener.fileno(), host_namespace, 2})
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        start = 3
        for fd in keep:  # Playwright's pipes to the browser (3, 4) must close when the browser exits
            if fd >= start:
                os.closerange(start, fd)
                start = fd + 1
        os.closerange(start, 65536)
        _check(_libc.setns(host_namespace, CLONE_NEWNET), "setns")
        os.close(host_namespace)
        try:
            _serve(listener, browser)
        finally:
            os._exit(0)
    listener.close()
    os.close(host_namespace)
    proxy = [f"--proxy-server=socks5://127.0.0.1:{port}", "--proxy-bypass-list=<-loopback>"]
    os.execv(CHROMIUM, [CHROMIUM, *proxy, *arguments])  # noqa: S606 (fixed path, the arguments are Playwright's)


if __name__ == "__main__":
    main(sys.argv[1:])
