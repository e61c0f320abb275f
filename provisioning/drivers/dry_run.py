"""The dry-run driver: opens nothing, runs nothing, writes nothing; it records what the real driver would do.

Every command succeeds with "[dry run] would run: …" as its stdout, except existence probes (`id <user>`,
`id -u <user>`, `getent passwd <user>`…), which answer "not found" like a fresh host, so flows take their
"create" branch and the log shows every step of a first-time provisioning.
"""

from __future__ import annotations

from .base import CommandResult, Connection, Driver, HostSpec, quote_argv

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

    def _execute(self, argv: list[str], *, command: str, stdin: bytes, timeout: float) -> CommandResult:
        shown = quote_argv(self.as_admin(argv))
        entry = f"run: {shown}"
        if stdin:
            entry += f" (stdin: {len(stdin)} bytes)"
        self.log.append(entry)
        return CommandResult(
            command=command,
            exit_status=_probe_status(argv),
            stdout=f"[dry run] would run: {shown}",
            stderr="",
            duration_s=0.0,
        )

    def put_file(
        self, remote_path: str, content: bytes, *, mode: int, owner: str | None = None, as_user: str | None = None
    ) -> None:
        self._checked_put_file(remote_path, mode=mode, owner=owner, as_user=as_user)  # the real thing's checks
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
