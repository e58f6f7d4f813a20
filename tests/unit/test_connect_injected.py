"""Commands that reach hosts take a `Connect`: logs and one service's deploy (rollout.service) run against FakeHost."""

from __future__ import annotations

from pathlib import Path

from opsctl.inventory.load import load_inventory
from opsctl.inventory.model import Host
from opsctl.logs import read_logs
from opsctl.remote.fake import FakeHost
from opsctl.rollout.service import current_release
from opsctl.systemd import JournalQuery

GOLDEN = Path(__file__).parent / "golden" / "inventory.yaml"
JOURNAL = "2026-11-29T22:40:01+0000 lab1 python[1]: DDTREE init mode=ddtree\n-- cursor: s=1\n"


def test_read_logs_runs_journalctl_through_the_given_connection() -> None:
    inv = load_inventory(GOLDEN)
    pairs = [(h, s) for h in inv.hosts for s in h.services]
    fakes: dict[str, FakeHost] = {}

    def connect(host: Host) -> FakeHost:
        fakes[host.name] = FakeHost(host.name, default=(0, JOURNAL, ""))
        return fakes[host.name]

    outcomes = read_logs(pairs, JournalQuery("", lines=5), connect)
    assert [o.host for o in outcomes] == [f"{h.name}/{s.name}" for h, s in pairs]
    assert all(o.value is not None and o.value.lines == [JOURNAL.splitlines()[0]] for o in outcomes)
    assert set(fakes) == {h.name for h, _ in pairs} and all(f.closed for f in fakes.values())
    ran = [c for f in fakes.values() for c in f.ran]
    assert all(c.startswith("journalctl -u opsctl-") and " -n 5" in c for c in ran)


def test_current_release_reads_facts_through_the_given_connection() -> None:
    host = load_inventory(GOLDEN).hosts[0]
    service = host.services[0]
    rid = "20261129T224001Z-3f9c0a1b2c4d"
    fake = FakeHost(host.name, default=(0, f"current /opt/opsctl/services/{service.name}/releases/{rid}\n", ""))
    assert current_release(host, service, lambda _: fake) == rid
    assert fake.closed
