"""What every provisioning driver offers: a host to reach, a connection that runs argv lists, and clear errors.

Commands are always argv lists: a connection joins them with `shlex.join`, so nothing a customer typed (a user
name, a key comment) is ever read by the remote shell as syntax. Files are written through `run()` too (temp file
in the same directory, modes set, then `mv`), so they never appear half-written or with the wrong mode, and the
same code path works for root and for a sudoer.
"""

from __future__ import annotations

import posixpath
import secrets
import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass
from types import TracebackType

# What a command's stdout or stderr may hold before the rest is dropped (the command keeps running to the end).
OUTPUT_CAP_BYTES = 1024 * 1024


@dataclass(frozen=True)
class HostSpec:
    """A GPU host and how the portal logs in to it."""

    name: str  # the operators' name for the host, used in messages ("gpu-1")
    address: str
    port: int
    username: str  # an admin account: root, or a NOPASSWD sudoer (then set use_sudo)
    host_key: str  # the pinned host public key, one OpenSSH line: "ssh-ed25519 AAAA... [comment]"
    client_key_path: str  # the portal's own private key for logging in to hosts (never a customer key)
    use_sudo: bool = False  # prefix every command with `sudo -n`

    def __repr__(self) -> str:  # the key material is long and not interesting in logs
        return f"HostSpec(name={self.name!r}, {self.username}@{self.address}:{self.port}, use_sudo={self.use_sudo})"


@dataclass(frozen=True)
class CommandResult:
    command: str  # the command as sent, shell-quoted (without the sudo / timeout wrapper)
    exit_status: int  # -1 when the command ended without one (killed by a signal, connection lost)
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class DriverError(Exception):
    """A provisioning step could not be done. `message` is safe to show operators (no secrets, no key material)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class CommandFailed(DriverError):
    """A command ran and exited non-zero; `result` holds its exit status and output."""

    def __init__(self, result: CommandResult, host_name: str = "") -> None:
        where = f" on {host_name}" if host_name else ""
        detail = _last_line(result.stderr) or _last_line(result.stdout)
        message = f"`{_shorten(result.command)}` exited with status {result.exit_status}{where}"
        if detail:
            message += f": {_shorten(detail)}"
        super().__init__(message)
        self.result = result


def quote_argv(argv: list[str]) -> str:
    """The argv list as one POSIX shell command line; refuses what cannot be passed safely."""
    if isinstance(argv, str | bytes) or not argv:
        raise TypeError("argv must be a non-empty list of strings")
    for arg in argv:
        if not isinstance(arg, str):
            raise TypeError(f"argv items must be str, got {type(arg).__name__}")
        if "\x00" in arg:
            raise ValueError("argv items must not contain NUL bytes")
    return shlex.join(argv)


class Connection(ABC):
    """An open session with one host. Use it as a context manager, or call close()."""

    host: HostSpec
    is_dry_run: bool = False  # True on the dry-run driver's connections: nothing really ran

    def __init__(self, host: HostSpec) -> None:
        self.host = host

    def run(
        self,
        argv: list[str],
        *,
        stdin: str | bytes | None = None,
        timeout: float = 120.0,
        check: bool = True,
    ) -> CommandResult:
        """Run argv (shell-quoted with shlex.join) and wait for it. check=True raises CommandFailed on non-zero exit;
        a command still running after `timeout` seconds is killed and raises DriverError."""
        command = quote_argv(argv)
        data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
        result = self._execute(argv, command=command, stdin=data, timeout=timeout)
        if check and not result.ok:
            raise CommandFailed(result, self.host.name)
        return result

    def as_admin(self, argv: list[str]) -> list[str]:
        """argv as the host's admin account runs it: behind `sudo -n` for a sudoer (HostSpec.use_sudo)."""
        return ["sudo", "-n", *argv] if self.host.use_sudo else argv

    @abstractmethod
    def _execute(self, argv: list[str], *, command: str, stdin: bytes, timeout: float) -> CommandResult:
        """Run the checked argv (`command`: it shell-quoted) on the host, feeding it `stdin`; the exit status is
        the caller's to check."""

    def put_file(
        self, remote_path: str, content: bytes, *, mode: int, owner: str | None = None, as_user: str | None = None
    ) -> None:
        """Write `content` to `remote_path` atomically: a temp file next to it gets the content, the mode and the
        owner ("user" or "user:group"), then `mv` puts it in place. The directory must exist.

        `as_user`: every command runs as that account (`runuser`), for files in a directory the account controls
        (a customer's home): root would follow whatever symlink the customer planted there, the account itself
        can only reach what it could reach anyway. The file is then owned by that account."""
        tmp_path = self._checked_put_file(remote_path, mode=mode, owner=owner, as_user=as_user)

        def as_writer(argv: list[str]) -> list[str]:
            return ["runuser", "-u", as_user, "--", *argv] if as_user else argv

        # One round trip: umask 077 (the content is never readable by others, even before the chmod), the mode,
        # the owner when one is given, then the move into place; the temp file is removed if any of it fails.
        script = (
            "# shellcheck disable=SC2015 # any step failing removes the temp file and exits with its status\n"
            'umask 077 && cat > "$1" && chmod "$2" "$1" && { [ -z "$3" ] || chown "$3" "$1"; } '
            '&& mv -f -T "$1" "$4" || { status=$?; rm -f "$1"; exit $status; }'
        )
        self.run(
            as_writer(["sh", "-c", script, "put_file", tmp_path, f"{mode:04o}", owner or "", remote_path]),
            stdin=content,
        )

    @staticmethod
    def _checked_put_file(remote_path: str, *, mode: int, owner: str | None, as_user: str | None) -> str:
        """The temp path that put_file writes `remote_path` through; ValueError for what it must refuse."""
        if not isinstance(remote_path, str) or not remote_path.startswith("/"):
            raise ValueError(f"remote path must be absolute: {remote_path!r}")
        if any(char in remote_path for char in "\x00\n") or remote_path.endswith("/"):
            raise ValueError(f"invalid remote path: {remote_path!r}")
        if not 0 <= mode <= 0o7777:
            raise ValueError(f"invalid file mode {mode:o}")
        if owner and as_user:
            raise ValueError("a file written as_user is owned by that user: owner must not be given too")
        directory, filename = posixpath.split(posixpath.normpath(remote_path))
        return posixpath.join(directory, f".{filename}.binome-tmp-{secrets.token_hex(6)}")

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Driver(ABC):
    name: str
    is_dry_run: bool = False

    @abstractmethod
    def connect(self, host: HostSpec, *, timeout: float = 15.0) -> Connection:
        """Open a connection to `host`; raises DriverError when it cannot."""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
