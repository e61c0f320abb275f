"""The real driver: paramiko, with the host key pinned and the portal's own key as the only credential.

- Host key: only `HostSpec.host_key` is in the client's key store (under `address` or `[address]:port`), the
  policy for anything else is RejectPolicy, and no known_hosts file is ever read. No pinned key, no connection.
- Login: the private key at `HostSpec.client_key_path` only: no agent, no ~/.ssh keys, no password.
- Commands: argv lists, shell-quoted; each runs under coreutils `timeout` on the host (so a hung command and its
  children are killed there), with a local deadline as a backstop; stdout and stderr are kept up to 1 MiB each;
  every exit status is checked unless the caller says check=False.
"""

from __future__ import annotations

import base64
import binascii
import errno
import shlex
import socket
import time

import paramiko

from .base import (
    OUTPUT_CAP_BYTES,
    CommandResult,
    Connection,
    Driver,
    DriverError,
    HostSpec,
)

# `timeout` sends TERM at the deadline, then KILL this many seconds later if the command is still there.
KILL_AFTER_S = 5
# How long past the remote deadline the local side waits before giving up on the channel.
LOCAL_GRACE_S = KILL_AFTER_S + 5
# timeout(1): 124 after TERM; after KILL, which it sends to itself too, the host has no status to send (-1 here).
_TIMEOUT_EXIT_STATUSES = {124, 137, -1}
_CHUNK = 65536
# The longest the pump waits before looking at stderr again (stdout and EOF wake it at once).
_LOOK_S = 0.05
# How long output may still come after the exit status when EOF does not (a process the command left holds its output).
_AFTER_EXIT_S = 2.0


class _PinnedKeyOnlyPolicy(paramiko.RejectPolicy):
    """RejectPolicy, with a message that says what went wrong (the pinned key is the only one ever accepted)."""

    def __init__(self, host: HostSpec) -> None:
        self.host = host

    def missing_host_key(self, client, hostname, key):
        raise DriverError(
            f"host key mismatch for {self.host.name}: the server offered a {key.get_name()} key "
            f"({key.fingerprint}) that is not the pinned one"
        )


def parse_host_key(host: HostSpec) -> paramiko.PKey:
    """The pinned host key as a paramiko key; DriverError when missing or not an OpenSSH public key line."""
    line = (host.host_key or "").strip()
    if not line:
        raise DriverError(f"no pinned host key for {host.name}: refusing to connect without one")
    fields = line.split()
    if len(fields) < 2:
        raise DriverError(f"the pinned host key for {host.name} is not an OpenSSH public key line")
    key_type, key_data = fields[0], fields[1]
    try:
        key = paramiko.PKey.from_type_string(key_type, base64.b64decode(key_data, validate=True))
    except (binascii.Error, ValueError, paramiko.SSHException, paramiko.UnknownKeyType) as exc:
        raise DriverError(f"the pinned host key for {host.name} is not a valid {key_type} public key") from exc
    return key


def _load_client_key(host: HostSpec) -> paramiko.PKey:
    try:
        return paramiko.PKey.from_path(host.client_key_path)
    except FileNotFoundError as exc:
        raise DriverError(f"the portal's SSH key {host.client_key_path} does not exist") from exc
    except PermissionError as exc:
        raise DriverError(f"the portal's SSH key {host.client_key_path} is not readable") from exc
    except paramiko.PasswordRequiredException as exc:
        raise DriverError(f"the portal's SSH key {host.client_key_path} is passphrase-protected") from exc
    except (paramiko.SSHException, ValueError, OSError) as exc:
        raise DriverError(f"the portal's SSH key {host.client_key_path} cannot be loaded: {exc}") from exc


def _host_key_name(host: HostSpec) -> str:
    return host.address if host.port == 22 else f"[{host.address}]:{host.port}"


class SSHDriver(Driver):
    name = "ssh"
    is_dry_run = False

    def connect(self, host: HostSpec, *, timeout: float = 15.0) -> SSHConnection:
        pinned_key = parse_host_key(host)
        client_key = _load_client_key(host)
        client = paramiko.SSHClient()
        # Only the pinned key: no system or user known_hosts is loaded.
        client.get_host_keys().add(_host_key_name(host), pinned_key.get_name(), pinned_key)
        client.set_missing_host_key_policy(_PinnedKeyOnlyPolicy(host))
        target = f"{host.username}@{host.address}:{host.port}"
        started = time.monotonic()
        try:
            client.connect(
                hostname=host.address,
                port=host.port,
                username=host.username,
                pkey=client_key,
                allow_agent=False,
                look_for_keys=False,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
            )
        except DriverError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise DriverError(
                f"host key mismatch for {host.name}: the server presented {exc.key.get_name()} "
                f"{exc.key.fingerprint}, the pinned key is {exc.expected_key.get_name()} {exc.expected_key.fingerprint}"
            ) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            if "timeout" in str(exc).lower():
                raise DriverError(f"timed out after {timeout:g} s authenticating to {host.name} ({target})") from exc
            raise DriverError(f"authentication failed for {target}: the portal's key was not accepted") from exc
        except paramiko.ssh_exception.NoValidConnectionsError as exc:
            client.close()
            refused = all(getattr(error, "errno", None) == errno.ECONNREFUSED for error in exc.errors.values())
            if refused:
                raise DriverError(f"connection refused by {host.name} ({host.address}:{host.port})") from exc
            raise DriverError(f"{host.name} ({host.address}:{host.port}) is unreachable") from exc
        except TimeoutError as exc:
            client.close()
            raise DriverError(f"timed out after {timeout:g} s connecting to {host.name} ({target})") from exc
        except socket.gaierror as exc:
            client.close()
            raise DriverError(f"cannot resolve {host.address} for {host.name}") from exc
        except paramiko.SSHException as exc:
            client.close()
            text = str(exc)
            if time.monotonic() - started >= timeout * 0.9:  # paramiko says "No existing session" on a slow handshake
                message = f"timed out after {timeout:g} s in the SSH handshake with {host.name} ({target})"
                raise DriverError(message) from exc
            if "banner" in text.lower():
                raise DriverError(f"no SSH banner from {host.name} ({target}) within {timeout:g} s") from exc
            raise DriverError(f"SSH error connecting to {host.name} ({target}): {text}") from exc
        except (EOFError, ConnectionError) as exc:
            client.close()
            raise DriverError(f"connection to {host.name} ({target}) closed during the SSH handshake") from exc
        except OSError as exc:
            client.close()
            raise DriverError(f"cannot connect to {host.name} ({target}): {exc.strerror or exc}") from exc
        # Each command is a few small packets each way (the channel's open, the exec, its end): with Nagle's algorithm
        # on, a small write waits for the peer's delayed ACK, 40 ms or more a command (bench/ssh_round_trips.py).
        client.get_transport().sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return SSHConnection(host, client)


class _CappedBuffer:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False

    def add(self, data: bytes) -> None:
        room = OUTPUT_CAP_BYTES - self.size
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        if data:
            self.chunks.append(data)
            self.size += len(data)

    def text(self) -> str:
        text = b"".join(self.chunks).decode("utf-8", errors="replace")
        return text + "\n[output truncated at 1 MiB]" if self.truncated else text


def _drain_stderr(channel: paramiko.Channel, stderr: _CappedBuffer) -> None:
    """What the host's stderr holds now, without waiting."""
    while channel.recv_stderr_ready():
        stderr.add(channel.recv_stderr(_CHUNK))


class SSHConnection(Connection):
    def __init__(self, host: HostSpec, client: paramiko.SSHClient) -> None:
        super().__init__(host)
        self._client = client

    def _execute(self, argv: list[str], *, command: str, stdin: bytes, timeout: float) -> CommandResult:
        if not timeout > 0:
            raise ValueError("timeout must be positive")
        remote_argv = self.as_admin(["timeout", f"--kill-after={KILL_AFTER_S}", f"{timeout:.3f}", *argv])

        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise DriverError(f"the connection to {self.host.name} is closed")
        started = time.monotonic()
        try:
            channel = transport.open_session(timeout=min(timeout, 30.0))
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise DriverError(f"cannot open a session on {self.host.name}: {exc}") from exc
        stdout, stderr = _CappedBuffer(), _CappedBuffer()
        try:
            channel.settimeout(min(timeout, 30.0))
            channel.exec_command(shlex.join(remote_argv))
            exit_status = self._pump(channel, stdin, stdout, stderr, deadline=started + timeout + LOCAL_GRACE_S)
        except TimeoutError as exc:
            raise DriverError(f"timed out after {timeout:g} s running `{command}` on {self.host.name}") from exc
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise DriverError(f"connection to {self.host.name} lost while running `{command}`: {exc}") from exc
        finally:
            channel.close()
        duration = time.monotonic() - started
        if exit_status in _TIMEOUT_EXIT_STATUSES and duration >= timeout - 0.05:
            raise DriverError(f"timed out after {timeout:g} s running `{command}` on {self.host.name}")
        return CommandResult(
            command=command,
            exit_status=exit_status,
            stdout=stdout.text(),
            stderr=stderr.text(),
            duration_s=duration,
        )

    @staticmethod
    def _pump(
        channel: paramiko.Channel, data: bytes, stdout: _CappedBuffer, stderr: _CappedBuffer, *, deadline: float
    ) -> int:
        """Feed stdin and read both outputs to the channel's end; the exit status, TimeoutError past the deadline.

        The command's output is whole only at the channel's EOF: sshd may send the exit status before the last of the
        output (the child is gone, its pipe not yet drained). So the pump waits for EOF, not for the status, in a
        blocking read of stdout that wakes at once on output or on EOF. A command that leaves a process holding its
        output (`cmd &`) never brings EOF: past `_AFTER_EXIT_S` after its status, what came is what it said.

        No select() on the channel: that gives it an OS pipe that Channel.close() closes while paramiko's transport
        thread may still write to it for data arriving then ("Socket exception: Bad file descriptor" ends the whole
        connection: paramiko issues #1700, #2271)."""
        view, sent = memoryview(data), 0
        if not data:
            channel.shutdown_write()  # commands that read stdin see EOF at once
        exited_at = None
        while True:
            while sent < len(view) and channel.send_ready():  # ready: room in the host's window, never blocks
                try:
                    sent += channel.send(view[sent : sent + _CHUNK])
                except OSError:
                    if not channel.closed:
                        raise
                    sent = len(view)  # the command ended without reading it all: its status and words say why
                    break
                if sent == len(view):
                    channel.shutdown_write()
            _drain_stderr(channel, stderr)
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError
            # stderr alone does not wake the read: it is looked at every _LOOK_S, sooner while stdin is still going.
            wait = min(_LOOK_S if sent == len(view) else _LOOK_S / 10, deadline - now)
            if channel.exit_status_ready():
                if exited_at is None:
                    exited_at = now
                if now - exited_at >= _AFTER_EXIT_S:
                    return channel.recv_exit_status()
                wait = min(wait, exited_at + _AFTER_EXIT_S - now)
            channel.settimeout(wait)
            try:
                chunk = channel.recv(_CHUNK)
            except TimeoutError:
                continue
            if chunk:
                stdout.add(chunk)
                continue
            # EOF: the SSH end of both streams, so stderr is whole too; the status follows. A channel closed without
            # EOF is a connection gone (the host sends EOF before it closes a command's channel).
            if not channel.eof_received:
                raise EOFError("the host closed the session before the command's end")
            _drain_stderr(channel, stderr)
            if not channel.status_event.wait(max(deadline - time.monotonic(), 0)):
                raise TimeoutError
            return channel.recv_exit_status()

    def close(self) -> None:
        self._client.close()
