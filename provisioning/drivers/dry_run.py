"""The dry-run driver: opens nothing, runs nothing, writes nothing; it records what the real driver would do.

Every command succeeds with "[dry run] would run: …" as its stdout, except existence probes (`id <user>`,
`id -u <user>`, `getent passwd <user>`…), which answer "not found" like a fresh host, so flows take their
"create" branch and the log shows every step of a first-time provisioning.
"""

from __future__ import annotations

from .base import CommandFailed, CommandResult, Connection, Driver, HostSpec, quote_argv

_GETENT_NOT_FOUND = 2  # getent(1): key not found in the database


def _probe_status(argv: list[str]) -> int:
    """The exit status a fresh host would give for an existence probe, 0 for anything else."""
    operands = [arg for arg in argv[1:] if not arg.startswith("-")]
    if argv[0] == "id" and operands:
        return 1
    if argv[0] == "getent" and len(operands) >= 2:
        return _GETENT_NOT_FOUND
    return 0


class DryRunConnection(Connection):
    is_dry_run = True  # the steps label what they report accordingly

    def __init__(self, host: HostSpec) -> None:
        super().__init__(host)
        self.log: list[str] = []  # "run: <command>" and "write: <path> (…)" lines, in order
        self.files: dict[str, bytes] = {}  # what put_file would have written, by remote path
        self.closed = False

    def run(
        self,
        argv: list[str],
        *,
        stdin: str | bytes | None = None,
        timeout: float = 120.0,
        check: bool = True,
    ) -> CommandResult:
        command = quote_argv(argv)
        shown = f"sudo -n {command}" if self.host.use_sudo else command
        entry = f"run: {shown}"
        if stdin:
            size = len(stdin.encode() if isinstance(stdin, str) else stdin)
            entry += f" (stdin: {size} bytes)"
        self.log.append(entry)
        result = CommandResult(
            command=command,
            exit_status=_probe_status(argv),
            stdout=f"[dry run] would run: {shown}",
            stderr="",
            duration_s=0.0,
        )
        if check and result.exit_status != 0:
            raise CommandFailed(result, self.host.name)
        return result

    def put_file(
        self, remote_path: str, content: bytes, *, mode: int, owner: str | None = None, as_user: str | None = None
    ) -> None:
        self._temp_path_for(remote_path)  # the same checks as the real thing
        if not 0 <= mode <= 0o7777:
            raise ValueError(f"invalid file mode {mode:o}")
        if owner and as_user:
            raise ValueError("a file written as_user is owned by that user: owner must not be given too")
        self.files[remote_path] = bytes(content)
        writer = f"written as {as_user}" if as_user else f"owner {owner or '(unchanged)'}"
        self.log.append(f"write: {remote_path} ({len(content)} bytes, mode {mode:04o}, {writer})")

    def close(self) -> None:
        self.closed = True


class DryRunDriver(Driver):
    name = "dry_run"
    is_dry_run = True

    def connect(self, host: HostSpec, *, timeout: float = 15.0) -> DryRunConnection:
        return DryRunConnection(host)
