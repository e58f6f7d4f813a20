"""Single-service deploy operations for other commands (bench --sweep): deploy a variant of a service through
the normal gated deploy path, read its current release, and restore a given release."""

from __future__ import annotations

from collections.abc import Callable

from opsctl import remote
from opsctl.deploy import release, runner
from opsctl.deploy.flow import DeploySettings
from opsctl.deploy.rollout import Outcome
from opsctl.deploy.wheel import runtime_wheel
from opsctl.errors import DeployError
from opsctl.inventory.model import Host, Service


def current_release(host: Host, service: Service) -> str | None:
    connection = remote.connect(host)
    try:
        facts = release.parse_release_facts(
            connection.run(release.facts_cmd(release.ServicePaths(service.name))).stdout
        )
    finally:
        connection.close()
    return facts.current


def deploy_variant(host: Host, service: Service, say: Callable[[str], None] = lambda _: None) -> None:
    """Deploy `service` (e.g. with other DDTree knobs) with the usual gates; raise if it did not go live."""
    report = runner.deploy([(host, [service])], runtime_wheel(), DeploySettings(), runner.RolloutOptions(), say)
    (result,) = report.results
    if result.outcome not in (Outcome.DEPLOYED, Outcome.UNCHANGED):
        raise DeployError(f"{host.name}/{service.name}: {result.outcome.value}: {result.message}")


def restore_release(host: Host, service: Service, release_id: str | None, say: Callable[[str], None]) -> None:
    """Make `release_id` current again (health gated); nothing to do when it already is."""
    if release_id is None or current_release(host, service) == release_id:
        return
    report = runner.rollback([(host, [service])], DeploySettings(), runner.RolloutOptions(), say, to=release_id)
    (result,) = report.results
    if result.outcome is not Outcome.REVERTED:
        raise DeployError(
            f"{host.name}/{service.name}: could not restore {release_id}: {result.message}",
            f"run `opsctl rollback --to {release_id}`",
        )
