"""Single-service deploy operations for other commands (bench --sweep): deploy a variant of a service through
the normal gated deploy path, read its current release, and restore a given release."""

from __future__ import annotations

from collections.abc import Callable

from opsctl import remote
from opsctl.artifact import runtime_wheel
from opsctl.deploy import release
from opsctl.deploy.flow import DeploySettings
from opsctl.deploy.outcome import Outcome
from opsctl.errors import DeployError, without_prefixes
from opsctl.inventory.model import Host, Service
from opsctl.remote.base import Connect
from opsctl.rollout import runner


def current_release(host: Host, service: Service, connect: Connect = remote.connect) -> str | None:
    conn = connect(host)
    try:
        facts = release.parse_release_facts(conn.run(release.facts_cmd(release.ServicePaths(service.name))).stdout)
    finally:
        conn.close()
    return facts.current


def deploy_variant(
    host: Host, service: Service, say: Callable[[str], None] = lambda _: None, connect: Connect = remote.connect
) -> None:
    """Deploy `service` (e.g. with other DDTree knobs) with the usual gates; raise if it did not go live."""
    wheel = runtime_wheel()
    report = runner.deploy([(host, [service])], wheel, DeploySettings(), runner.RolloutOptions(), say, connect)
    (result,) = report.results
    if result.outcome not in (Outcome.DEPLOYED, Outcome.UNCHANGED):
        said = without_prefixes(result.message, host.name, f"{host.name}/{service.name}", result.outcome.value)
        raise DeployError(f"{host.name}/{service.name}: {result.outcome.value}: {said}")


def restore_release(
    host: Host, service: Service, release_id: str | None, say: Callable[[str], None], connect: Connect = remote.connect
) -> None:
    """Make `release_id` current again (health gated); nothing to do when it already is."""
    if release_id is None or current_release(host, service, connect) == release_id:
        return
    settings, options = DeploySettings(), runner.RolloutOptions()
    report = runner.rollback([(host, [service])], settings, options, say, to=release_id, connect=connect)
    (result,) = report.results
    if result.outcome is not Outcome.REVERTED:
        raise DeployError(
            f"{host.name}/{service.name}: could not restore {release_id}: {result.message}",
            f"run `opsctl rollback --to {release_id}`",
        )
