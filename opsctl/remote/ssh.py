"""SSH hosts on paramiko: strict host keys, timeouts, keepalive, retries, jump host, one connection per host.

paramiko is used directly (Fabric's Connection adds nothing we need and hides the channel, which we need for
timeouts and for killing the remote process group on timeout or Ctrl-C). Every paramiko/socket exception is
translated into opsctl.errors here and nowhere else.

Remote processes: sshd starts each command's shell as a session leader (setsid), so the shell's pid is the
process group of everything the command starts. The command first prints that pid on a marker line; on timeout
or Ctrl-C we `kill -TERM -PGID` (then -KILL) over a second channel, so nothing is left running on the host.
(A pty would do it through SIGHUP, but a pty merges stderr into stdout and echoes stdin, which carries secrets.)
"""

from __future__ import annotations

import contextlib
import logging
import select
import shlex
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

import paramiko

from opsctl.commands import Cmd
from opsctl.errors import CommandTimeout, HostKeyError, RemoteError, UnreachableError
from opsctl.inventory.model import Endpoint, Host, HostKeyPolicy, SshConfig
from opsctl.progress import run_streamed
from opsctl.remote import base
from opsctl.remote.base import RunResult
from opsctl.remote.local import LocalHost
from opsctl.remote.peerwatch import PeerWatch
from opsctl.remote.rsync import PROGRESS_FLAGS, error_tail, parse_progress, rsync_error, ssh_command

log = logging.getLogger("opsctl.remote")
# paramiko's transport thread logs each failed handshake (a port that is not sshd, a reset) with its traceback at
# ERROR; with no handler configured Python prints that on stderr. The failure reaches the caller as one
# UnreachableError line (below), so paramiko's own report only goes to handlers a user configured.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

PGID_MARK = "__OPSCTL_PGID__="
EOF_GRACE_S = 2.0  # after the exit status, how long to wait for the output streams to close
BACKOFF_S = 0.5  # first retry delay; doubles per attempt
BACKOFF_MAX_S = 8.0
SESSION_REFUSED_WAIT_S = 30.0  # how long a session sshd refuses (MaxSessions reached) is retried
MAX_SESSIONS = 8  # concurrent commands per connection; sshd's default MaxSessions is 10 (one spare for kills)
# A host found dead (keepalive unanswered) is not connected to again for this many keepalive intervals: the calls
# that follow at once (a lock release, a journal tail) would each spend connect_timeout x connect_retries on it
# (17 s in the lab after the 30 s of detection) before saying what is already known.
DEAD_HOLD_KEEPALIVES = 2
_KNOWN_HOSTS_LOCK = threading.Lock()  # one writer of known_hosts files per process


class _UnknownHostKey(paramiko.SSHException):
    pass


class _Policy(paramiko.MissingHostKeyPolicy):
    """Unknown host keys: refuse (strict) or accept once and append to known_hosts (accept-new).

    A changed key is never accepted: paramiko raises BadHostKeyException before consulting the policy.
    """

    def __init__(self, policy: HostKeyPolicy, known_hosts: Path) -> None:
        self.policy = policy
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if self.policy is not HostKeyPolicy.ACCEPT_NEW:
            raise _UnknownHostKey(f"{hostname} is not in {self.known_hosts} ({_fingerprint(key)})")
        client.get_host_keys().add(hostname, key.get_name(), key)
        with _KNOWN_HOSTS_LOCK:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            with self.known_hosts.open("a") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        log.warning("recorded new host key for %s in %s (%s)", hostname, self.known_hosts, _fingerprint(key))


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


class SshHost:
    """One inventory host over SSH. Connects lazily; the connection is reused by every call and thread."""

    def __init__(self, host: Host, retry_timeouts: bool = True) -> None:
        self.name = host.name
        self.retry_timeouts = retry_timeouts  # False: an attempt that used up connect_timeout is the last
        self.config: SshConfig = host.ssh
        self.endpoint = Endpoint(host.address, host.ssh.port, host.ssh.user)
        self.known_hosts = Path(host.ssh.known_hosts_file).expanduser()
        self.key_file = str(Path(host.ssh.key_file).expanduser()) if host.ssh.key_file else None
        self.jump = Endpoint.parse_jump(host.ssh.jump_host, host.ssh.user) if host.ssh.jump_host else None
        self._lock = threading.Lock()
        self._client: paramiko.SSHClient | None = None
        self._jump_client: paramiko.SSHClient | None = None
        self._sessions = threading.BoundedSemaphore(MAX_SESSIONS)
        self._watch: PeerWatch | None = None  # the current connection's dead-peer detection
        self._dead: tuple[float, str] | None = None  # (when, why) the host was found dead on a connection

    # -- connection ------------------------------------------------------------------------------------

    @property
    def as_root(self) -> bool:
        return self.config.user == "root"

    def open(self) -> SshHost:
        """Connect now (otherwise the first call connects)."""
        self._transport()
        return self

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            if self._client is not None:
                transport = self._client.get_transport()
                if transport is not None and transport.is_active():
                    return transport
                self._close_clients()
            self._refuse_if_dead()
            self._client = self._connect_with_retries()
            self._dead = None
            transport = self._client.get_transport()
            assert transport is not None  # connect() succeeded
            self._watch = PeerWatch(transport, self.config.keepalive) if self.config.keepalive > 0 else None
            return transport

    def _refuse_if_dead(self) -> None:
        """A host found dead moments ago is reported at once, not after a silent reconnect with retries; once
        DEAD_HOLD_KEEPALIVES intervals have passed, a call connects again (a host that came back works)."""
        if self._dead is None:
            return
        when, why = self._dead
        age = time.monotonic() - when
        if age < DEAD_HOLD_KEEPALIVES * self.config.keepalive:
            raise UnreachableError(
                self.name,
                f"{why} {age:.0f} s ago; not reconnecting yet",
                "the host is down or hung, or the network to it is cut; check it, then run the same command again",
            )

    def _connect_with_retries(self) -> paramiko.SSHClient:
        attempts = max(1, self.config.connect_retries)
        reason = ""
        made = 0
        for attempt in range(attempts):
            made, started = attempt + 1, time.monotonic()
            try:
                return self._connect_once()
            except (_UnknownHostKey, paramiko.BadHostKeyException) as exc:
                raise HostKeyError(self.name, _host_key_reason(exc, self.known_hosts)) from None
            except paramiko.AuthenticationException as exc:
                if not auth_timed_out(exc):  # the host refused the key: another attempt gets the same answer
                    raise UnreachableError(
                        self.name,
                        f"authentication failed for {self.endpoint.user}@{self.endpoint.address}: {exc}",
                        "check ssh.user and ssh.key_file, and that the key is in the host's authorized_keys",
                    ) from None
                reason = f"no answer to authentication within {self.config.connect_timeout:g}s"
            except (OSError, EOFError, paramiko.SSHException) as exc:
                reason = _describe(exc)
            self._close_clients()
            if not self.retry_timeouts and time.monotonic() - started >= 0.9 * self.config.connect_timeout:
                break  # the host did not answer within the timeout: a reader is told now, not after every retry
            if attempt + 1 < attempts:
                delay = min(BACKOFF_S * 2**attempt, BACKOFF_MAX_S)
                log.info("%s: connect failed (%s); retry %d in %.1fs", self.name, reason, attempt + 1, delay)
                time.sleep(delay)
        where = f"{self.endpoint.address}:{self.endpoint.port}"
        raise UnreachableError(self.name, f"{where}: {reason} (after {made} attempt{'s' if made > 1 else ''})")

    def _connect_once(self) -> paramiko.SSHClient:
        sock: paramiko.Channel | None = None
        if self.jump is not None:
            self._jump_client = self._new_client(self.jump, None)
            jump_transport = self._jump_client.get_transport()
            assert jump_transport is not None
            sock = jump_transport.open_channel(
                "direct-tcpip",
                (self.endpoint.address, self.endpoint.port),
                ("127.0.0.1", 0),
                timeout=self.config.connect_timeout,
            )
        return self._new_client(self.endpoint, sock)

    def _new_client(self, endpoint: Endpoint, sock: paramiko.Channel | None) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if self.known_hosts.exists():
            client.load_host_keys(str(self.known_hosts))
        elif self.config.host_key_policy is HostKeyPolicy.STRICT:
            raise _UnknownHostKey(f"known_hosts file {self.known_hosts} does not exist")
        client.set_missing_host_key_policy(_Policy(self.config.host_key_policy, self.known_hosts))
        timeout = self.config.connect_timeout
        try:
            client.connect(
                endpoint.address,
                port=endpoint.port,
                username=endpoint.user,
                key_filename=self.key_file,
                allow_agent=self.key_file is None,
                look_for_keys=self.key_file is None,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
                sock=sock,
            )
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(self.config.keepalive)
        _no_delay(transport)
        return client

    def _close_clients(self) -> None:
        for client in (self._client, self._jump_client):
            if client is not None:
                client.close()
        self._client = None
        self._jump_client = None

    def close(self) -> None:
        with self._lock:
            self._close_clients()

    def __enter__(self) -> SshHost:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- commands --------------------------------------------------------------------------------------

    def run(self, cmd: Cmd, timeout: float | None = None, check: bool = True) -> RunResult:
        line = base.command_line(self.name, cmd, self.as_root)
        display = cmd.display()
        limit = self.config.command_timeout if timeout is None else timeout
        log.debug("%s: run %s", self.name, display)
        start = time.monotonic()
        with self._session_slot():
            return base.checked(self._run(cmd, line, display, start, limit), check)

    def _run(self, cmd: Cmd, line: str, display: str, start: float, limit: float) -> RunResult:
        chan = self._open_channel(display)
        pgid: list[int] = []
        try:
            chan.exec_command(f"echo {PGID_MARK}$$; {line}")
            if cmd.stdin is not None:
                chan.sendall(cmd.stdin.encode())
            chan.shutdown_write()
            out, err, code = self._wait(chan, display, start + limit, pgid)
        except CommandTimeout:
            self._kill_group(pgid, cmd.sudo)
            raise CommandTimeout(self.name, display, limit) from None
        except KeyboardInterrupt:
            self._kill_group(pgid, cmd.sudo)
            raise
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise UnreachableError(self.name, f"connection lost during `{display}`: {_describe(exc)}") from None
        finally:
            chan.close()
        return RunResult(self.name, display, code, out, err, time.monotonic() - start)

    @contextlib.contextmanager
    def _session_slot(self) -> Iterator[None]:
        """At most MAX_SESSIONS commands at once on the shared connection (sshd's MaxSessions is 10)."""
        while not self._sessions.acquire(timeout=base.POLL_S):
            if base.CANCEL.is_set():
                raise KeyboardInterrupt
        try:
            yield
        finally:
            self._sessions.release()

    def _open_channel(self, display: str) -> paramiko.Channel:
        # a refused session is sshd freeing slots (the connection is alive): on a loaded host that can outlast
        # connect_timeout (5 s in the lab, seen on a saturated 2-core CI machine), so it gets a longer bound
        refused_until = time.monotonic() + max(self.config.connect_timeout, SESSION_REFUSED_WAIT_S)
        delay = 0.05
        reconnected = False
        while True:
            transport = self._transport()
            try:
                return transport.open_session(timeout=self.config.connect_timeout)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                if transport.is_active():
                    # The connection is alive and other commands may be running on it: never close it under them.
                    # sshd frees a session slot only after its close handshake, so under load a new session can
                    # be refused for a moment even below MaxSessions, or be slow to open on a saturated host
                    # (closing the connection here would end every command in flight on it). Retry briefly,
                    # then report.
                    if time.monotonic() < refused_until:
                        time.sleep(delay)
                        delay = min(delay * 2, 1.0)
                        continue
                    if not isinstance(exc, paramiko.ChannelException):
                        raise UnreachableError(self.name, f"cannot open a channel: {_describe(exc)}") from None
                    raise RemoteError(
                        self.name,
                        display,
                        None,
                        message=f"{self.name}: sshd refused a session: {_describe(exc)}",
                        hint="check MaxSessions in the host's sshd_config",
                    ) from None
                # A cached connection can die between calls (host rebooted): reconnect once.
                self.close()
                if reconnected:
                    raise UnreachableError(self.name, f"cannot open a channel: {_describe(exc)}") from None
                reconnected = True

    def _wait(self, chan: paramiko.Channel, display: str, deadline: float, pgid: list[int]) -> tuple[str, str, int]:
        """Collect output until exit (and EOF); raise CommandTimeout/KeyboardInterrupt/UnreachableError."""
        out = bytearray()
        err = bytearray()
        exited_at: float | None = None
        watch = self._watch
        while True:
            received = len(out) + len(err)
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            if watch is not None and (len(out) + len(err) != received or chan.exit_status_ready()):
                watch.heard()
            if not pgid and b"\n" in out:
                first, _, rest = bytes(out).partition(b"\n")
                text = first.decode(errors="replace")
                if text.startswith(PGID_MARK):
                    pgid.append(int(text[len(PGID_MARK) :]))
                    out = bytearray(rest)
            now = time.monotonic()
            if chan.exit_status_ready():
                exited_at = exited_at or now
                closed = chan.eof_received or now - exited_at > EOF_GRACE_S
                if closed and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
            elif chan.closed:
                raise UnreachableError(self.name, f"connection lost during `{display}`")
            if base.CANCEL.is_set():
                raise KeyboardInterrupt
            if now > deadline:
                raise CommandTimeout(self.name, display, 0)
            silence = watch.silent_for() if watch is not None else None
            if silence is not None:
                with self._lock:  # the next call is refused at once for a while, then connects afresh
                    self._dead = (now, f"found dead (no answer for {silence:.0f} s, SSH keepalive unanswered)")
                    self._close_clients()
                raise UnreachableError(
                    self.name,
                    f"no answer for {silence:.0f} s during `{display}` (SSH keepalive unanswered)",
                    hint="the host is down or hung, or the network to it is cut; check it, then run the same "
                    "command again",
                )
            select.select([chan], [], [], base.POLL_S)
        code = chan.recv_exit_status()
        transport = chan.get_transport()
        if code == -1 and (not chan.eof_received or transport is None or not transport.is_active()):
            # Closed without an exit status or EOF: the connection died (host down), not the command.
            raise UnreachableError(self.name, f"connection lost during `{display}`")
        return out.decode(errors="replace"), err.decode(errors="replace"), code

    def _kill_group(self, pgid: list[int], sudo: bool) -> None:
        """Terminate the remote process group of an abandoned command (best effort)."""
        if not pgid:
            return
        group = f"-{pgid[0]}"  # dash's kill takes `-TERM -PGID` (no `--`)
        script = f"kill -TERM {group} 2>/dev/null && sleep 1 && kill -KILL {group} 2>/dev/null; true"
        line = base.command_line(self.name, Cmd.of("sh", "-c", script, sudo=sudo), self.as_root)
        try:
            transport = self._transport()
            chan = transport.open_session(timeout=self.config.connect_timeout)
            try:
                chan.exec_command(line)
                chan.settimeout(self.config.connect_timeout + 2)
                chan.recv_exit_status()
            finally:
                chan.close()
            log.info("%s: killed remote process group %s", self.name, pgid[0])
        except Exception as exc:  # the host may be gone; nothing more we can do
            log.warning("%s: could not kill remote process group %s: %s", self.name, pgid[0], exc)

    # -- files -----------------------------------------------------------------------------------------

    def put_text(self, text: str, remote_path: str, mode: int = 0o644) -> None:
        """Atomic write: temp file (0600 from creation) in the same directory, chmod, rename.

        The content travels on stdin, so secrets never appear on a command line; works with sudo too.
        """
        self.run(_put_text_cmd(remote_path, mode, text), timeout=self.config.command_timeout)

    def put_file(self, local: Path, remote_path: str, mode: int = 0o644) -> None:
        """Copy one file with rsync over the same SSH settings (rsync writes a temp file and renames)."""
        self._rsync([str(local)], remote_path, [f"--chmod=F{mode:o}", "--perms", "--times"])

    def get_text(self, remote_path: str) -> str:
        return self.run(Cmd.of("cat", "--", remote_path, sudo=True)).stdout

    def sync_dir(self, local_dir: Path, remote_dir: str, progress: Callable[[str], None] | None = None) -> None:
        self.run(Cmd.of("mkdir", "-p", "--", remote_dir, sudo=True))
        flags = ["-a", *(PROGRESS_FLAGS if progress is not None else [])]
        self._rsync([str(local_dir).rstrip("/") + "/"], remote_dir.rstrip("/") + "/", flags, progress)

    def _rsync(
        self, sources: list[str], dest: str, flags: list[str], progress: Callable[[str], None] | None = None
    ) -> None:
        self._transport()  # verifies (or, with accept-new, records) the host key before ssh checks strictly
        argv = [
            "rsync",
            *flags,
            "-e",
            shlex.join(ssh_command(self.config, self.known_hosts, self.key_file, self.jump)),
        ]
        if not self.as_root:
            argv.append("--rsync-path=sudo -n rsync")
        target = f"{self.endpoint.user}@{_bracket(self.endpoint.address)}:{dest}"
        argv += ["--", *sources, target]
        if shutil.which("rsync") is None:
            raise RemoteError(
                self.name,
                "rsync",
                None,
                message="rsync is not installed on the control machine",
                hint="apt-get install -y rsync",
            )
        if progress is not None:
            self._rsync_streamed(argv, dest, progress)
            return
        # LocalHost: its own process group, killed on timeout or Ctrl-C like a remote command.
        try:
            result = LocalHost(self.name).run(Cmd.of(*argv), timeout=self.config.command_timeout, check=False)
        except CommandTimeout:
            raise CommandTimeout(self.name, f"rsync to {dest}", self.config.command_timeout) from None
        if not result.ok:
            raise rsync_error(self.name, result.command, result.exit_code, result.stderr)

    def _rsync_streamed(self, argv: list[str], dest: str, progress: Callable[[str], None]) -> None:
        """rsync with --info=progress2, each progress line handed over as bytes, rate and ETA."""

        def on_line(line: str) -> None:
            if (text := parse_progress(line)) is not None:
                progress(text)

        done = run_streamed(argv, on_line, timeout=self.config.command_timeout, cancelled=base.CANCEL.is_set)
        if done.cancelled:
            raise KeyboardInterrupt
        if done.timed_out:
            raise CommandTimeout(self.name, f"rsync to {dest}", self.config.command_timeout)
        if done.exit_code != 0:
            raise rsync_error(self.name, shlex.join(argv), done.exit_code, error_tail(done.tail))


def connect(host: Host) -> SshHost:
    """An SSH host for an inventory host. Lazy: the first call connects (errors surface per host there)."""
    return SshHost(host)


def connect_for_reads(host: Host) -> SshHost:
    """`connect` for commands that only read (status): a host that lets an attempt time out is reported at once
    (one connect_timeout, not ssh.connect_retries of them); quick failures (refused, reset) are still retried."""
    return SshHost(host, retry_timeouts=False)


def _no_delay(transport: paramiko.Transport) -> None:
    """Send small packets at once, as OpenSSH does: with Nagle's algorithm on, every channel open waits for the
    peer's delayed ACK (about 40 ms per command, measured on the lab; 3 ms with this)."""
    if isinstance(transport.sock, socket.socket):  # a jump host's channel is not a TCP socket: its own is set
        transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _put_text_cmd(remote_path: str, mode: int, text: str) -> Cmd:
    script = (
        'umask 077 && tmp=$(mktemp "$1.opsctl-tmp-XXXXXX") && cat > "$tmp" && chmod "$2" "$tmp"'
        ' && mv -f "$tmp" "$1" || { rc=$?; rm -f "$tmp"; exit $rc; }'
    )
    return Cmd.of("sh", "-c", script, "put_text", remote_path, f"{mode:o}", stdin=text, sudo=True)


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def auth_timed_out(exc: paramiko.AuthenticationException) -> bool:
    """paramiko raises the same exception type when the host refuses the key and when the host (a busy one, or an
    sshd just booted) does not answer the authentication within auth_timeout: only the second is worth a retry
    (a lab CI run lost a test to one, after a host's reboot at load 10)."""
    return str(exc).strip().lower().startswith("authentication timeout")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return "connection refused"
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _host_key_reason(exc: Exception, known_hosts: Path) -> str:
    if isinstance(exc, paramiko.BadHostKeyException):
        return (
            f"the key of {exc.hostname} CHANGED: it offers {_fingerprint(exc.key)}, "
            f"{known_hosts} has {_fingerprint(exc.expected_key)} "
            " (possible man-in-the-middle, or a reinstalled host)"
        )
    return f"unknown host key: {exc}"
