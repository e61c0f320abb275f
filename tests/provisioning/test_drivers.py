"""The provisioning drivers against a real OpenSSH server (see conftest.py), and the dry-run driver."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import socket
import time
from pathlib import Path

import paramiko
import pytest

from provisioning.drivers import CommandFailed, DriverError, HostSpec, get_driver
from provisioning.drivers.dry_run import DryRunConnection, DryRunDriver
from provisioning.drivers.ssh import KILL_AFTER_S, SSHDriver
from tests.provisioning.conftest import _free_port, generate_keypair, random_username, remove_user

# --- the factory ---------------------------------------------------------------------------------------------------


def test_get_driver_knows_ssh_and_dry_run():
    ssh, dry_run = get_driver("ssh"), get_driver("dry_run")
    assert isinstance(ssh, SSHDriver) and ssh.name == "ssh" and ssh.is_dry_run is False
    assert isinstance(dry_run, DryRunDriver) and dry_run.name == "dry_run" and dry_run.is_dry_run is True
    with pytest.raises(ValueError, match="unknown provisioning driver"):
        get_driver("telnet")


# --- running commands ----------------------------------------------------------------------------------------------


def test_runs_as_root(admin):
    result = admin.run(["id", "-u"])
    assert result.stdout.strip() == "0"
    assert result.exit_status == 0 and result.stderr == ""
    assert result.command == "id -u"
    assert result.duration_s > 0


def test_stdin_reaches_the_command(admin):
    assert admin.run(["cat"], stdin="hello\nwörld\n").stdout == "hello\nwörld\n"
    assert admin.run(["cat"]).stdout == ""  # no stdin: the command sees EOF at once instead of hanging


def test_large_stdin_and_output_do_not_deadlock(admin):
    payload = os.urandom(3 * 1024 * 1024)  # larger than the SSH window, both ways
    result = admin.run(["sh", "-c", "tee /dev/stderr | sha256sum"], stdin=payload, timeout=60)
    assert result.stdout.split()[0] == hashlib.sha256(payload).hexdigest()


def test_output_is_capped_at_one_mebibyte(admin):
    result = admin.run(["sh", "-c", "yes | head -c 3000000; yes err | head -c 2000000 >&2"], timeout=60)
    assert result.stdout.startswith("y\ny\n")
    assert result.stdout.endswith("[output truncated at 1 MiB]")
    assert len(result.stdout) < 1024 * 1024 + 100
    assert result.stderr.endswith("[output truncated at 1 MiB]")


def test_failing_command_raises_with_status_and_stderr(admin):
    argv = ["sh", "-c", "echo partial; echo 'no such thing' >&2; exit 3"]
    with pytest.raises(CommandFailed) as caught:
        admin.run(argv)
    result = caught.value.result
    assert result.exit_status == 3
    assert result.stdout == "partial\n"
    assert result.stderr == "no such thing\n"
    assert "status 3" in caught.value.message and "no such thing" in caught.value.message
    assert "test-sshd" in caught.value.message

    unchecked = admin.run(argv, check=False)
    assert unchecked.exit_status == 3 and unchecked.stderr == "no such thing\n"


def test_shell_metacharacters_are_not_interpreted(admin, sshd):
    sentinel = sshd.directory / f"sentinel-{os.getpid()}"
    sentinel.write_text("still here")
    argv = ["echo", "$(id)", ";", "rm", "-rf", str(sentinel), "`id`", "&&", "|", "*", "'\"", "a\nb", "$HOME"]
    result = admin.run(argv)
    assert result.stdout == " ".join(argv[1:]) + "\n"
    assert sentinel.read_text() == "still here"
    result = admin.run(["printf", "%s|", "two words", "", "--x"])
    assert result.stdout == "two words||--x|"


def test_put_file_writes_content_mode_and_owner_atomically(admin, sshd):
    target = sshd.directory / f"put-{os.getpid()}"
    content = b"first line\n\x00\xff binary is fine\n"
    admin.put_file(str(target), content, mode=0o640, owner="nobody:nogroup")
    assert target.read_bytes() == content
    assert admin.run(["stat", "-c", "%a %U %G", str(target)]).stdout.strip() == "640 nobody nogroup"

    admin.put_file(str(target), b"replaced\n", mode=0o600)  # overwrites; owner unchanged when not given
    assert target.read_bytes() == b"replaced\n"
    assert admin.run(["stat", "-c", "%a %U", str(target)]).stdout.strip() == "600 root"
    assert not [path for path in sshd.directory.iterdir() if ".binome-tmp-" in path.name]  # no temp file left

    with pytest.raises(ValueError, match="absolute"):
        admin.put_file("relative/path", b"x", mode=0o600)


def test_put_file_failure_leaves_nothing_behind(admin, sshd):
    target = sshd.directory / f"put-bad-owner-{os.getpid()}"
    with pytest.raises(CommandFailed, match="chown"):
        admin.put_file(str(target), b"x", mode=0o600, owner="no-such-user-binome")
    assert not target.exists()
    assert not [path for path in sshd.directory.iterdir() if ".binome-tmp-" in path.name]


@pytest.fixture
def sent_commands(monkeypatch) -> list[str]:
    """Every command line the SSH driver sends to a host."""
    sent = []
    real = paramiko.Channel.exec_command

    def exec_command(self, command):
        sent.append(command)
        return real(self, command)

    monkeypatch.setattr(paramiko.Channel, "exec_command", exec_command)
    return sent


@pytest.fixture
def connect_calls(monkeypatch) -> list[dict]:
    """The keyword arguments of every connection paramiko is asked to make (its timeouts among them)."""
    calls = []
    real = paramiko.SSHClient.connect

    def connect(self, *args, **kwargs):
        calls.append(kwargs)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(paramiko.SSHClient, "connect", connect)
    return calls


def test_command_timeout_kills_the_command(admin, sent_commands):
    """Waited out, the command would succeed (exit 0, no error); it is cut at 1 s by the host itself and killed there.
    The driver's local deadline (1 s + grace) catches a host that does not."""
    with pytest.raises(DriverError, match=r"timed out after 1 s") as caught:
        admin.run(["sh", "-c", "sleep 31.4159; echo never"], timeout=1)
    assert not isinstance(caught.value, CommandFailed)
    # sudo -n first for a sudoer (HostSpec.use_sudo)
    assert shlex.split(sent_commands[-1])[-6:] == [
        "timeout",
        f"--kill-after={KILL_AFTER_S}",
        "1.000",
        "sh",
        "-c",
        "sleep 31.4159; echo never",
    ]
    time.sleep(0.2)
    # Killed on the host too ("[.]": the pattern must not match the command line of pgrep's own wrapper).
    assert admin.run(["pgrep", "-f", "sleep 31[.]4159"], check=False).exit_status == 1


def test_exit_status_124_of_a_quick_command_is_not_a_timeout(admin):
    with pytest.raises(CommandFailed) as caught:
        admin.run(["sh", "-c", "exit 124"], timeout=30)
    assert caught.value.result.exit_status == 124


def test_the_connection_sends_each_command_at_once_without_waiting_for_the_host_s_acknowledgement(sshd):
    """Every command is a few small packets each way; with Nagle's algorithm on, each waits for the host's delayed
    ACK (about 45 ms a command here, ten times the command: bench/ssh_round_trips.py shows both)."""
    with SSHDriver().connect(sshd.host_spec) as connection:
        sock = connection._client.get_transport().sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert connection.run(["true"]).ok


def test_every_command_s_last_output_arrives_on_a_connection_that_goes_on(admin):
    """sshd may send a command's exit status before the end of its output; the driver reads to the channel's end.
    Many short commands back to back, each with a last line on both streams: none is cut, none ends the connection
    (closing a channel while the host's last packets come is where paramiko's transport thread once broke)."""
    for number in range(150):
        script = f"printf '%s' {number}; printf 'e{number}' >&2; exit {number % 3}"
        result = admin.run(["sh", "-c", script], check=False)
        assert (result.stdout, result.stderr, result.exit_status) == (str(number), f"e{number}", number % 3)


def test_a_command_that_leaves_a_process_holding_its_output_still_returns(admin):
    """`cmd &` keeps the output open after the command's end, so the channel's end never comes while it runs: the
    driver returns what came once the status is in, instead of waiting past its deadline (1 s + grace here)."""
    try:
        result = admin.run(["sh", "-c", "sleep 27.1828 & echo started"], timeout=1)
        assert result.ok and result.stdout == "started\n"
    finally:
        admin.run(["pkill", "-f", "sleep 27[.]1828"], check=False)


def test_a_command_that_ends_before_reading_its_input_gives_its_status_and_its_words(admin):
    """A write refused at once (no such directory, no sudo) ends the command while the portal still sends: its exit
    status and stderr are the answer, not a connection said to be lost."""
    for _ in range(20):
        result = admin.run(["sh", "-c", "echo 'no such directory' >&2; exit 3"], stdin=os.urandom(2**19), check=False)
        assert (result.exit_status, result.stderr) == (3, "no such directory\n")


def test_a_connection_dropped_during_a_command_is_an_error_not_an_exit_status(sshd):
    """The host's session ends mid-command (its sshd killed, the network gone): the driver says the connection was
    lost, even for a caller that reads exit statuses itself, instead of handing it a status the host never sent."""
    drop = (
        'p=$$; while [ "$p" -gt 1 ]; do case "$(ps -o comm= -p "$p")" in sshd*) kill -9 "$p"; break;; esac; '
        'p=$(ps -o ppid= -p "$p" | tr -d " "); done; sleep 3'
    )
    with SSHDriver().connect(sshd.host_spec) as connection, pytest.raises(DriverError, match="lost while running"):
        connection.run(["sh", "-c", drop], check=False, timeout=20)


def test_a_command_that_ignores_the_stop_signal_is_killed_and_said_to_have_timed_out(admin):
    """`timeout` sends TERM at the deadline and KILL five seconds later, to the command and itself: the host then
    sends no exit status, only the signal. That is a timeout too, not a failure with an unknown status."""
    with pytest.raises(DriverError, match=r"timed out after 1 s") as caught:
        admin.run(["sh", "-c", "trap '' TERM; sleep 27.2718; echo never"], timeout=1)
    assert not isinstance(caught.value, CommandFailed)
    time.sleep(0.2)
    assert admin.run(["pgrep", "-f", "sleep 27[.]2718"], check=False).exit_status == 1


def test_closed_connection_refuses_to_run(sshd):
    connection = get_driver("ssh").connect(sshd.host_spec)
    with connection:
        assert connection.run(["true"]).exit_status == 0
    with pytest.raises(DriverError, match="closed"):
        connection.run(["true"])


# --- refusing to connect -------------------------------------------------------------------------------------------


def test_wrong_pinned_host_key_is_refused(sshd, tmp_path):
    _, other_key = generate_keypair(tmp_path / "other_host_key")
    host = dataclasses.replace(sshd.host_spec, host_key=other_key)
    with pytest.raises(DriverError, match="host key mismatch for test-sshd") as caught:
        get_driver("ssh").connect(host)
    assert "SHA256:" in caught.value.message


def test_pinned_key_of_another_type_is_refused(sshd, tmp_path):
    _, rsa_key = generate_keypair(tmp_path / "rsa_host_key", key_type="rsa")
    host = dataclasses.replace(sshd.host_spec, host_key=rsa_key)
    with pytest.raises(DriverError, match="host key mismatch for test-sshd"):
        get_driver("ssh").connect(host)


@pytest.mark.parametrize("host_key", ["", "   ", "ssh-ed25519", "ssh-ed25519 not-base64!!", "ssh-foo AAAA"])
def test_missing_or_malformed_host_key_is_refused_before_connecting(sshd, host_key):
    host = dataclasses.replace(sshd.host_spec, host_key=host_key)
    with pytest.raises(DriverError, match="host key"):
        get_driver("ssh").connect(host)


def test_no_pinned_key_message(sshd):
    with pytest.raises(DriverError) as caught:
        get_driver("ssh").connect(dataclasses.replace(sshd.host_spec, host_key=""))
    assert caught.value.message == "no pinned host key for test-sshd: refusing to connect without one"


def test_connection_refused_on_a_closed_port(sshd, connect_calls):
    """Refused at the first attempt, not retried until the timeout runs out."""
    host = dataclasses.replace(sshd.host_spec, port=_free_port())
    with pytest.raises(DriverError, match="connection refused"):
        get_driver("ssh").connect(host, timeout=5)
    assert len(connect_calls) == 1


def test_wrong_client_key_fails_authentication(sshd, tmp_path):
    other_key, _ = generate_keypair(tmp_path / "not_the_portal_key")
    host = dataclasses.replace(sshd.host_spec, client_key_path=str(other_key))
    with pytest.raises(DriverError, match=r"authentication failed for root@127\.0\.0\.1"):
        get_driver("ssh").connect(host)


def test_missing_client_key_file(sshd, tmp_path):
    host = dataclasses.replace(sshd.host_spec, client_key_path=str(tmp_path / "nope"))
    with pytest.raises(DriverError, match="does not exist"):
        get_driver("ssh").connect(host)


def test_silent_server_times_out(sshd, connect_calls):
    """A server that accepts TCP and never sends a banner: one attempt, every wait of it bounded by the timeout."""
    with socket.socket() as listener:  # accepts TCP but never sends a banner
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        host = dataclasses.replace(sshd.host_spec, port=listener.getsockname()[1])
        with pytest.raises(DriverError, match=r"(banner .* within 1 s|timed out after 1 s)"):
            get_driver("ssh").connect(host, timeout=1)
    waits = ("timeout", "banner_timeout", "auth_timeout", "channel_timeout")
    assert [{wait: call[wait] for wait in waits} for call in connect_calls] == [dict.fromkeys(waits, 1)]


# --- a customer, end to end ----------------------------------------------------------------------------------------


def _install_customer(admin, user: str, public_key: str, *, shell: str = "/bin/bash") -> str:
    """useradd + ~/.ssh (700) + authorized_keys (600), owned by the user, through the driver; returns the home."""
    admin.run(["useradd", "--create-home", "--shell", shell, user])
    home = admin.run(["getent", "passwd", user]).stdout.strip().split(":")[5]
    admin.run(["install", "-d", "-m", "700", "-o", user, "-g", user, f"{home}/.ssh"])
    admin.put_file(f"{home}/.ssh/authorized_keys", (public_key + "\n").encode(), mode=0o600, owner=f"{user}:{user}")
    return home


def test_customer_logs_in_with_the_key_installed_by_the_driver(admin, login_as, keypair):
    user = random_username()
    private_key, public_key = keypair()
    try:
        home = _install_customer(admin, user, public_key)
        modes = admin.run(["stat", "-c", "%a %U", f"{home}/.ssh", f"{home}/.ssh/authorized_keys"]).stdout
        assert modes.split("\n")[:2] == [f"700 {user}", f"600 {user}"]

        login = login_as(user, private_key, "whoami")
        assert login.returncode == 0, login.stderr
        assert login.stdout.strip() == user

        other_key, _ = keypair("someone_else")
        assert login_as(user, other_key, "whoami").returncode == 255  # only the installed key opens the door
    finally:
        remove_user(admin, user)
    assert admin.run(["id", "-u", user], check=False).exit_status == 1


def test_strict_modes_refuse_a_world_writable_authorized_keys(admin, login_as, keypair):
    """StrictModes yes. (Debian's sshd tolerates group-writable files when the group is the user's private group,
    so 664 would still log in; world-writable never does.)"""
    user = random_username()
    private_key, public_key = keypair()
    try:
        home = _install_customer(admin, user, public_key)
        admin.run(["chmod", "666", f"{home}/.ssh/authorized_keys"])
        assert login_as(user, private_key, "whoami").returncode == 255
        admin.run(["chmod", "600", f"{home}/.ssh/authorized_keys"])
        admin.run(["chmod", "777", f"{home}/.ssh"])
        assert login_as(user, private_key, "whoami").returncode == 255
        admin.run(["chmod", "700", f"{home}/.ssh"])
        assert login_as(user, private_key, "whoami").returncode == 0
    finally:
        remove_user(admin, user)


def test_password_lock_does_not_stop_key_logins_but_expiry_does(admin, login_as, keypair):
    """Facts for revocation on this sshd (UsePAM yes): `usermod --lock` leaves keys working; expiring the account
    (or removing authorized_keys) is what closes the door."""
    user = random_username()
    private_key, public_key = keypair()
    try:
        _install_customer(admin, user, public_key)
        admin.run(["usermod", "--lock", user])
        assert login_as(user, private_key, "true").returncode == 0
        admin.run(["usermod", "--expiredate", "1", user])
        assert login_as(user, private_key, "true").returncode == 255
    finally:
        remove_user(admin, user)


def test_what_a_non_interactive_command_sources(admin, login_as, keypair):
    """Where an environment variable reaches `ssh host cmd`: the top of ~/.bashrc does (bash sources it for commands
    run by sshd, before Debian's "not interactive: return" guard); /etc/profile.d does not (login shells only)."""
    user = random_username()
    private_key, public_key = keypair()
    profile_d = Path(f"/etc/profile.d/{user}.sh")
    try:
        home = _install_customer(admin, user, public_key)
        bashrc = admin.run(["cat", f"{home}/.bashrc"]).stdout
        assert "*) return;;" in bashrc  # Debian's skeleton: stops early when not interactive
        admin.put_file(
            f"{home}/.bashrc",
            f"export FOO=1\n{bashrc}export AFTER_GUARD=1\n".encode(),
            mode=0o644,
            owner=f"{user}:{user}",
        )
        admin.put_file(str(profile_d), b"export VIA_PROFILE_D=1\n", mode=0o644)

        login = login_as(user, private_key, 'echo "FOO=$FOO AFTER_GUARD=$AFTER_GUARD PROFILE_D=$VIA_PROFILE_D"')
        assert login.returncode == 0, login.stderr
        assert login.stdout.strip() == "FOO=1 AFTER_GUARD= PROFILE_D="

        # The exported variable reaches the programs the command starts.
        login = login_as(user, private_key, "python3 -c 'import os; print(os.environ.get(\"FOO\"))'")
        assert login.stdout.strip() == "1"

        # A login shell (what an interactive session starts) gets all three.
        login = login_as(user, private_key, 'bash -lic "echo FOO=\\$FOO AFTER_GUARD=\\$AFTER_GUARD P=\\$VIA_PROFILE_D"')
        assert login.stdout.strip().splitlines()[-1] == "FOO=1 AFTER_GUARD=1 P=1"

        # With /bin/sh as the login shell nothing of ~/.bashrc is read.
        admin.run(["usermod", "--shell", "/bin/sh", user])
        assert login_as(user, private_key, 'echo "[$FOO]"').stdout.strip() == "[]"
    finally:
        profile_d.unlink(missing_ok=True)
        remove_user(admin, user)


def test_sudoer_admin_account_with_use_sudo(admin, sshd, tmp_path):
    if admin.run(["sh", "-c", "command -v sudo"], check=False).exit_status != 0:
        pytest.fail("sudo is missing: run `make system-deps`, or `apt-get install sudo`", pytrace=False)
    user = random_username("binome-admin")
    sudoers = f"/etc/sudoers.d/{user}"
    try:
        admin.run(["useradd", "--create-home", "--shell", "/bin/bash", user])
        admin.put_file(sudoers, f"{user} ALL=(ALL) NOPASSWD: ALL\n".encode(), mode=0o440)
        admin.run(["visudo", "-c", "-f", sudoers])
        client_public = Path(sshd.host_spec.client_key_path + ".pub").read_text()
        sshd.authorize_admin_key(user, client_public)
        host = dataclasses.replace(sshd.host_spec, username=user, use_sudo=True)
        with get_driver("ssh").connect(host) as sudoer:
            assert sudoer.run(["id", "-u"]).stdout.strip() == "0"
            target = sshd.directory / f"sudo-put-{os.getpid()}"
            sudoer.put_file(str(target), b"via sudo\n", mode=0o600, owner="root:root")
            assert target.read_bytes() == b"via sudo\n"
            assert sudoer.run(["stat", "-c", "%a %U", str(target)]).stdout.strip() == "600 root"
            assert sudoer.run(["cat"], stdin="through sudo\n").stdout == "through sudo\n"
            with pytest.raises(DriverError, match="timed out after 1 s"):
                sudoer.run(["sleep", "27.1828"], timeout=1)
            time.sleep(0.2)
            assert admin.run(["pgrep", "-f", "sleep 27[.]1828"], check=False).exit_status == 1
        without_sudo = dataclasses.replace(host, use_sudo=False)
        with get_driver("ssh").connect(without_sudo) as plain:
            assert plain.run(["id", "-u"]).stdout.strip() != "0"
    finally:
        (sshd.authorized_keys_dir / user).unlink(missing_ok=True)
        admin.run(["rm", "-f", sudoers])
        remove_user(admin, user)


# --- dry run -------------------------------------------------------------------------------------------------------


def test_dry_run_records_and_never_touches_the_host(sshd):
    connections_before = sshd.log_text().count("Connection from")
    target = sshd.directory / f"dry-run-{os.getpid()}"
    driver = get_driver("dry_run")
    with driver.connect(sshd.host_spec) as connection:
        assert isinstance(connection, DryRunConnection)
        probe = connection.run(["id", "-u", "alice"], check=False)
        assert probe.exit_status == 1  # a fresh host: flows take the "create" branch
        created = connection.run(["useradd", "--create-home", "alice"])
        assert created.exit_status == 0
        assert created.stdout == "[dry run] would run: useradd --create-home alice"
        connection.run(["rm", "-rf", str(target)], stdin="ignored")
        connection.put_file(str(target), b"ssh-ed25519 AAAA alice\n", mode=0o600, owner="alice:alice")
    assert connection.closed
    assert connection.log == [
        "run: id -u alice",
        "run: useradd --create-home alice",
        f"run: rm -rf {target} (stdin: 7 bytes)",
        f"write: {target} (23 bytes, mode 0600, owner alice:alice)",
    ]
    assert connection.files == {str(target): b"ssh-ed25519 AAAA alice\n"}
    assert not target.exists()
    assert sshd.log_text().count("Connection from") == connections_before


def test_dry_run_needs_no_reachable_host_and_shows_sudo():
    host = HostSpec(
        name="gpu-x",
        address="203.0.113.7",
        port=2222,
        username="ops",
        host_key="",
        client_key_path="/nonexistent",
        use_sudo=True,
    )
    connection = get_driver("dry_run").connect(host)
    assert connection.run(["id", "-u"]).exit_status == 0  # no user operand: not a probe
    assert connection.run(["getent", "passwd", "bob"], check=False).exit_status == 2
    with pytest.raises(CommandFailed) as caught:
        connection.run(["id", "bob"])
    assert caught.value.result.exit_status == 1
    assert connection.log[0] == "run: sudo -n id -u"
    assert connection.run(["echo", "$(id)"]).stdout == "[dry run] would run: sudo -n echo '$(id)'"
