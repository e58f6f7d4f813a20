"""Helpers for the deploy lab tests: derived lab inventories, the real CLI as a subprocess,
an HTTP poller, facts read through opsctl.remote, and a fault injector for "crash N s after healthy".

`loading_held` holds a restarted reference server in its loading phase until the test releases it (the server's
DDTREE_SERVE_HOLD_LOADING_WHILE hook), so a test of a server that is still starting never races its start-up.

The fault injector is a .pth hook installed into the lab host's venv for the duration of one test: Python
runs it at start, and only when the service's environment carries OPSCTL_FAULT_CRASH=<port>:<seconds> does it
start a thread that waits for /health to answer 200 and then kills the process. Nothing in opsctl or the
runtime knows about it.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from opsctl.commands import Cmd, sh
from opsctl.inventory.load import load_inventory
from opsctl.remote import connect
from tests.lab import lab_parts

REPO = Path(__file__).resolve().parents[2]
# Knobs for running these tests against another base inventory (e.g. baseline-only while the tiny drafter is
# being built): the base inventory, the mode the fault tests deploy, and whether to provision first.
# The base inventory: the one this pytest's lab writes (inventory/lab.yaml, or its part's: tests/lab/lab_parts.py).
LAB_INVENTORY = Path(os.environ.get("OPSCTL_DEPLOY_TEST_INVENTORY", "") or lab_parts.inventory_path())
MODE = os.environ.get("OPSCTL_DEPLOY_TEST_MODE", "shadow")
SKIP_PROVISION = os.environ.get("OPSCTL_DEPLOY_TEST_SKIP_PROVISION") == "1"
OPSCTL = [sys.executable, "-c", "from opsctl.cli.app import main; main()"]


def derived_inventory(path: Path, mutate: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of inventory/lab.yaml changed by `mutate` (the lab's own file is never touched)."""
    doc = yaml.safe_load(LAB_INVENTORY.read_text())
    mutate(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def service(doc: dict[str, Any], host: str, name: str = "ref") -> dict[str, Any]:
    return doc["hosts"][host]["services"][name]


def add_service(doc: dict[str, Any], host: str, name: str, port: int, **fields: Any) -> dict[str, Any]:
    svc = copy.deepcopy(service(doc, host, "ref"))
    svc["port"] = port
    svc.update(fields)
    doc["hosts"][host]["services"][name] = svc
    return svc


def only_hosts(doc: dict[str, Any], names: list[str]) -> None:
    doc["hosts"] = {k: v for k, v in doc["hosts"].items() if k in names}


def tune(doc: dict[str, Any], readiness_delay: float = 3, health_timeout: float = 240, log_interval: int = 10) -> None:
    """Lab timings: a short readiness delay, a generous first-health timeout (2 shared CPU cores)."""
    for host in doc["hosts"].values():
        for svc in host["services"].values():
            svc.setdefault("readiness_delay", readiness_delay)
            svc.setdefault("health_timeout", health_timeout)
            svc.setdefault("ddtree", {}).setdefault("log_interval", log_interval)


def opsctl(*args: str, timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OPSCTL, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


@dataclass
class Background:
    """`opsctl ...` running in the background; stderr lines collected as they arrive (and stdout's too, in
    `out_lines`, when started with `background(..., stdout_lines=True)`)."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    stdout: str = ""
    _pump: threading.Thread = field(default_factory=threading.Thread)
    out_lines: list[str] = field(default_factory=list)
    _out_pump: threading.Thread | None = None

    def wait_for_stdout(self, found: Callable[[list[str]], bool], what: str, timeout: float) -> None:
        """Until `found(out_lines)` (stdout_lines=True only): a wait on what opsctl printed, not on the clock."""
        deadline = time.monotonic() + timeout
        while not found(list(self.out_lines)):
            if self.proc.poll() is not None:
                raise AssertionError(f"opsctl exited {self.proc.returncode} before {what}:\n" + self.text)
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout}s; stdout so far:\n" + "\n".join(self.out_lines))
            time.sleep(0.2)

    def wait_for(self, needle: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if needle in line:
                    return line
            if self.proc.poll() is not None and not any(needle in x for x in self.lines):
                time.sleep(0.2)
                if not any(needle in x for x in self.lines):
                    raise AssertionError(f"opsctl exited {self.proc.returncode} before {needle!r}:\n" + self.text)
            time.sleep(0.1)
        raise AssertionError(f"no {needle!r} within {timeout}s:\n" + self.text)

    def finish(self, timeout: float = 600) -> int:
        """Wait for exit; collect stdout; close the pipes (ResourceWarnings are errors here)."""
        assert self.proc.stdout is not None
        if self._out_pump is None:
            self.stdout = self.proc.stdout.read()
        code = self.proc.wait(timeout=timeout)
        if self._out_pump is not None:
            self._out_pump.join(timeout=10)
            self.stdout = "".join(f"{line}\n" for line in self.out_lines)
        self._pump.join(timeout=10)
        self.proc.stdout.close()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def background(*args: str, stdout_lines: bool = False) -> Background:
    proc = subprocess.Popen([*OPSCTL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    bg = Background(proc)

    def pump(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    bg._pump = threading.Thread(target=pump, args=(proc.stderr, bg.lines), daemon=True)
    bg._pump.start()
    if stdout_lines:
        bg._out_pump = threading.Thread(target=pump, args=(proc.stdout, bg.out_lines), daemon=True)
        bg._out_pump.start()
    return bg


@dataclass
class Poller:
    """GET a URL every `interval` seconds in a thread; records (time, status or None)."""

    url: str
    interval: float = 0.25
    results: list[tuple[float, int | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=2) as response:
                    status: int | None = response.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            except (urllib.error.URLError, OSError, TimeoutError):
                status = None
            self.results.append((time.monotonic(), status))
            self._stop.wait(self.interval)

    @property
    def failures(self) -> list[tuple[float, int | None]]:
        return [r for r in self.results if r[1] != 200]

    def wait_for(self, found: Callable[[list[tuple[float, int | None]]], bool], what: str, timeout: float) -> None:
        """Until `found(results)`: a wait on the answers polled, however long one takes on a loaded machine."""
        deadline = time.monotonic() + timeout
        while not found(list(self.results)):
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout}s; polled: {self.results[-20:]}")
            time.sleep(0.1)


@contextmanager
def polling(url: str) -> Iterator[Poller]:
    poller = Poller(url)
    thread = threading.Thread(target=poller.run, daemon=True)
    thread.start()
    try:
        yield poller
    finally:
        poller._stop.set()
        thread.join(timeout=5)


def remote_run(inventory: Path, host: str, cmd: Cmd, check: bool = True) -> str:
    inv = load_inventory(inventory)
    with connect(inv.host(host)) as conn:
        return conn.run(cmd, check=check).stdout


def unit_props(inventory: Path, host: str, unit: str) -> dict[str, str]:
    out = remote_run(
        inventory, host, Cmd.of("systemctl", "show", "-p", "NRestarts,ActiveEnterTimestamp,MainPID,ActiveState", unit)
    )
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def current_release(inventory: Path, host: str, svc: str) -> str:
    return (
        remote_run(inventory, host, Cmd.of("readlink", f"/opt/opsctl/services/{svc}/current"))
        .strip()
        .rsplit("/", 1)[-1]
    )


def current_mode(inventory: Path, host: str, svc: str) -> str:
    text = remote_run(inventory, host, Cmd.of("cat", f"/opt/opsctl/services/{svc}/current/manifest.json"))
    return str(json.loads(text)["mode"])


def lock_present(inventory: Path, host: str) -> bool:
    out = remote_run(inventory, host, sh("test -e /run/lock/opsctl/deploy.lock && echo yes || echo no"))
    return out.strip() == "yes"


def is_bad(inventory: Path, host: str, svc: str, release: str) -> bool:
    out = remote_run(
        inventory, host, sh(f"test -e /opt/opsctl/services/{svc}/releases/{release}/BAD && echo yes || echo no")
    )
    return out.strip() == "yes"


FAULT_MODULE = """\
import os, threading, time, urllib.request
spec = os.environ.get("OPSCTL_FAULT_CRASH", "")
if spec and "--help" not in getattr(__import__("sys"), "argv", []):
    port, after = spec.split(":")
    def _watch():
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except Exception:
                pass
            time.sleep(0.2)
        time.sleep(float(after))
        print(f"OPSCTL_FAULT_CRASH: exiting {after}s after the first healthy answer", flush=True)
        os._exit(17)
    threading.Thread(target=_watch, daemon=True).start()
"""


@contextmanager
def crash_fault_installed(inventory: Path, host: str, venv: str = "/opt/opsctl/venv") -> Iterator[None]:
    site = remote_run(
        inventory, host, Cmd.of(f"{venv}/bin/python", "-c", "import site; print(site.getsitepackages()[0])")
    ).strip()
    inv = load_inventory(inventory)
    with connect(inv.host(host)) as conn:
        conn.put_text(FAULT_MODULE, f"{site}/opsctl_test_fault.py")
        conn.put_text("import opsctl_test_fault\n", f"{site}/opsctl_test_fault.pth")
    try:
        yield
    finally:
        remote_run(inventory, host, Cmd.of("rm", "-f", f"{site}/opsctl_test_fault.pth", f"{site}/opsctl_test_fault.py"))


HOLD_FILE = "/run/opsctl-test-hold-loading"
HOLD_DROP_IN = "/run/systemd/system/{unit}.d/opsctl-test-hold.conf"


@contextmanager
def loading_held(inventory: Path, host: str, unit: str) -> Iterator[Callable[[], None]]:
    """While this lasts, `unit`'s reference server started from now on stays in its loading phase (/health 503)
    until the function it yields is called: the server's DDTREE_SERVE_HOLD_LOADING_WHILE hook, set through a
    runtime drop-in (not the release, so a re-deploy still sees the same config), naming HOLD_FILE."""
    drop_in = HOLD_DROP_IN.format(unit=unit)
    inv = load_inventory(inventory)
    with connect(inv.host(host)) as conn:
        conn.run(Cmd.of("mkdir", "-p", str(Path(drop_in).parent)))
        conn.put_text(f"[Service]\nEnvironment=DDTREE_SERVE_HOLD_LOADING_WHILE={HOLD_FILE}\n", drop_in)
        conn.run(Cmd.of("touch", HOLD_FILE))
        conn.run(Cmd.of("systemctl", "daemon-reload"))

    def release() -> None:
        remote_run(inventory, host, Cmd.of("rm", "-f", HOLD_FILE))

    try:
        yield release
    finally:
        release()
        remote_run(inventory, host, Cmd.of("rm", "-f", drop_in))
        remote_run(inventory, host, Cmd.of("systemctl", "daemon-reload"))


PROVISION_ARGS = os.environ.get("OPSCTL_DEPLOY_TEST_PROVISION_ARGS", "").split()


def provision(inventory: Path = LAB_INVENTORY, *args: str, always: bool = False) -> subprocess.CompletedProcess[str]:
    """`opsctl provision` (skipped with OPSCTL_DEPLOY_TEST_SKIP_PROVISION=1 unless `always`)."""
    if SKIP_PROVISION and not always:
        return subprocess.CompletedProcess(["provision"], 0, "", "")
    return opsctl("provision", "-i", str(inventory), *args, *PROVISION_ARGS, timeout=1800)


def provisioned_and_deployed(path: Path, mutate: Callable[[dict[str, Any]], None]) -> Path:
    """The lab provisioned, the lab inventory with `mutate` applied written to `path`, and that inventory deployed
    in MODE (each step asserted): a module's starting point."""
    result = provision()
    assert result.returncode == 0, result.stderr[-3000:]
    inv = derived_inventory(path, mutate)
    deployed = opsctl("deploy", "-i", str(inv), "--mode", MODE)
    assert deployed.returncode == 0, deployed.stderr[-4000:]
    return inv
