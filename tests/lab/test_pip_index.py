"""The index probe against real network paths: a package index served in a network namespace made here, an
address in that namespace where nothing answers, and real `pip download` (the control machine's pip).

Nothing leaves this machine: pip's configuration files are switched off (PIP_CONFIG_FILE=/dev/null) and every
index the test names is inside the namespace.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from opsctl import pip_index, wheelhouse
from opsctl.kernel.locks import Lock, Profile

pytestmark = pytest.mark.lab

SLOT = int(os.environ.get("OPSCTL_LAB_SLOT", "0") or 0)
NETNS = f"olab{SLOT}-pidx"
VETH = (f"olab{SLOT}pidx0", f"olab{SLOT}pidx1")
NET = f"10.{240 + SLOT}.0"
WHEEL = "opsctl_probe_demo-1.0-py3-none-any.whl"


@dataclass(frozen=True)
class Index:
    up: str  # a PEP 503 index that answers
    refused: str  # the namespace's address, a port nobody listens on
    silent: str  # an address on the namespace's link that nobody holds: no answer at all


def _ip(*argv: str, check: bool = True) -> None:
    subprocess.run(["ip", *argv], check=check, capture_output=True)


def _wheel(directory: Path) -> None:
    files = {
        "opsctl_probe_demo/__init__.py": b"",
        "opsctl_probe_demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: opsctl-probe-demo\nVersion: 1.0\n",
        "opsctl_probe_demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("opsctl_probe_demo-1.0.dist-info/RECORD,,")
    with zipfile.ZipFile(directory / WHEEL, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("opsctl_probe_demo-1.0.dist-info/RECORD", "\n".join(record) + "\n")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    if os.geteuid() != 0:
        pytest.skip("needs root (a network namespace)")
    root = tmp_path_factory.mktemp("index")
    (root / "simple/opsctl-probe-demo").mkdir(parents=True)
    _wheel(root)
    (root / "simple/opsctl-probe-demo/index.html").write_text(f'<a href="../../{WHEEL}">{WHEEL}</a>\n')
    _ip("netns", "del", NETNS, check=False)
    _ip("link", "del", VETH[0], check=False)
    _ip("netns", "add", NETNS)
    server = None
    try:
        _ip("link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1])
        _ip("link", "set", VETH[1], "netns", NETNS)
        _ip("addr", "add", f"{NET}.1/24", "dev", VETH[0])
        _ip("link", "set", VETH[0], "up")
        _ip("-n", NETNS, "addr", "add", f"{NET}.2/24", "dev", VETH[1])
        _ip("-n", NETNS, "link", "set", VETH[1], "up")
        _ip("-n", NETNS, "link", "set", "lo", "up")
        server = subprocess.Popen(
            ["ip", "netns", "exec", NETNS, sys.executable, "-m", "http.server", "-b", f"{NET}.2", "8000"],
            cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        up = f"http://{NET}.2:8000/simple"
        deadline = time.monotonic() + 15
        while pip_index.probe(up, timeout=1.0) is not None:
            assert time.monotonic() < deadline, "the namespace's index server did not start"
            time.sleep(0.2)
        yield Index(up=up, refused=f"http://{NET}.2:9/simple", silent=f"http://{NET}.3:8000/simple")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
        _ip("link", "del", VETH[0], check=False)
        _ip("netns", "del", NETNS, check=False)


@pytest.fixture
def pip_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip sees only what each test sets: no configuration files, no PIP_* variables of this machine."""
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")


def test_probe_tells_up_refused_and_silent_apart(index: Index) -> None:
    # three silent addresses (nobody holds .3-.5): one at a time that is 3 timeouts (>= 12 s, however idle the
    # machine); at once one timeout (4 s) and 6 s of slack for a loaded CI machine
    silent = [index.silent, *(index.silent.replace(f"{NET}.3:", f"{NET}.{n}:") for n in (4, 5))]
    start = time.monotonic()
    got = pip_index.probe_all([index.up, index.refused, *silent], timeout=4.0)
    took = time.monotonic() - start
    assert got[index.up] is None
    assert got[index.refused] is not None and "refused" in got[index.refused].lower()
    assert all(got[s] is not None for s in silent) and len(set(silent)) == 3
    assert took < 10.0  # all at once: one timeout, not three


@pytest.mark.usefixtures("pip_env")
def test_unreachable_lock_index_is_skipped_and_the_download_succeeds(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", index.up)
    monkeypatch.setenv("PIP_TRUSTED_HOST", f"{NET}.2")  # plain http inside the namespace
    lock = Lock(Profile.REFERENCE, "demo.txt", f"--extra-index-url {index.silent}\nopsctl-probe-demo==1.0\n")
    lines: list[str] = []
    start = time.monotonic()
    built = wheelhouse.ensure(lock, tmp_path / "wh", out=lines.append)
    took = time.monotonic() - start
    assert built.files == (WHEEL,)
    assert lines[0].startswith(f"wheelhouse demo.txt: skipping package index {index.silent}: unreachable (")
    assert took < 45.0  # without the probe pip retries the silent index for minutes


@pytest.mark.usefixtures("pip_env")
def test_no_reachable_index_fails_in_seconds_with_one_line(
    index: Index, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", index.refused)
    lock = Lock(Profile.REFERENCE, "demo.txt", f"--extra-index-url {index.silent}\nopsctl-probe-demo==1.0\n")
    start = time.monotonic()
    with pytest.raises(wheelhouse.WheelhouseError) as info:
        wheelhouse.ensure(lock, tmp_path / "wh", out=lambda _: None)
    assert time.monotonic() - start < 30.0  # pip alone retries the indexes for minutes
    line = info.value.one_line()
    assert line.startswith(f"wheelhouse for demo.txt: no package index is reachable: {index.refused} (")
    assert line.endswith("and 1 more (fix the control machine's pip configuration (pip config list), or pass "
                         "--wheelhouse DIR)")  # fmt: skip
    assert "\n" not in line
