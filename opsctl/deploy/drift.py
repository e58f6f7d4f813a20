"""Drift: a release's files on the host (and the installed unit) against the digests its manifest recorded at
deploy time (`Manifest.files`: sha256 of each file as rendered, the API key as `***`). A unit or env file edited
by hand, or a server.yaml changed under a release, is found by `status` (one line per difference) instead of a
`status` that exits 0 and a `deploy` that calls the release unchanged.

The host hashes each file itself (one command, nothing copied back): server.yaml's `api-key:` line and the
element after `"--api-key"` in a router's router.json are masked there as the renderers mask them, so the digest
of a file that holds the key is comparable with the recorded one and the key never leaves the host. The
comparison is pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opsctl.commands import Cmd
from opsctl.deploy import release
from opsctl.deploy.release import ServicePaths
from opsctl.errors import OpsctlError
from opsctl.remote.base import Connection

INSTALLED = "installed unit"
_MASKED_KEY = 'api-key: "***"'  # opsctl.render's masked server.yaml line
_JSON_KEY = r'("--api-key",\n *)"(?:[^"\\]|\\.)*"'  # the key in router.json (json.dumps, indent=1): a JSON string

# argv: label=path pairs; prints `label<TAB>sha256` (or `-` when the file is absent) per pair
_HASH = (
    "import hashlib, re, sys\n"
    "for arg in sys.argv[1:]:\n"
    "    label, _, path = arg.partition('=')\n"
    "    try:\n"
    "        text = open(path, 'rb').read().decode()\n"
    "    except (OSError, UnicodeDecodeError):\n"
    "        print(label + '\\t-'); continue\n"
    "    if path.endswith('.yaml'):\n"
    "        text = re.sub(r'(?m)^api-key:.*$', MASKED, text)\n"
    "    if path.endswith('.json'):\n"
    "        text = re.sub(JSON_KEY, lambda m: m.group(1) + '\"***\"', text)\n"
    "    print(label + '\\t' + hashlib.sha256(text.encode()).hexdigest())\n"
)


def hash_cmd(paths: ServicePaths, releases: Mapping[str, Sequence[str]]) -> Cmd:
    """sha256 of each named file of each release (`<release>/<name>`) and of the installed unit."""
    pairs = [f"{rid}/{name}={paths.release_file(rid, name)}" for rid, names in releases.items() for name in names]
    pairs.append(f"{INSTALLED}={paths.installed_unit}")
    code = f"MASKED = {_MASKED_KEY!r}\nJSON_KEY = {_JSON_KEY!r}\n{_HASH}"
    return Cmd.of("python3", "-c", code, *pairs, sudo=True)


def parse_hashes(stdout: str) -> dict[str, str | None]:
    """hash_cmd's output -> label: sha256 (None: absent or unreadable). Lines that do not parse are left out."""
    out: dict[str, str | None] = {}
    for line in stdout.splitlines():
        label, sep, digest = line.rpartition("\t")
        if not sep or not label:
            continue
        if digest == "-":
            out[label] = None
        elif len(digest) == 64 and all(c in "0123456789abcdef" for c in digest):
            out[label] = digest
    return out


def differences(
    release_id: str, recorded: Mapping[str, str], found: Mapping[str, str | None], installed_unit: str = ""
) -> list[str]:
    """One line per file of `release_id` that is not what was deployed; with `installed_unit` (its path: the
    release is current) the unit systemd runs is compared with the release's unit too."""
    lines = []
    for name, digest in sorted(recorded.items()):
        label = f"{release_id}/{name}"
        if label not in found:
            continue  # not read (the host's answer did not name it): no claim either way
        now = found[label]
        if now is None:
            lines.append(f"release {release_id}: {name} is missing on the host")
        elif now != digest:
            lines.append(
                f"release {release_id}: {name} changed on the host since the deploy (sha256 {digest[:12]} "
                f"recorded, {now[:12]} now)"
            )
    unit = recorded.get("unit")
    if installed_unit and unit is not None and INSTALLED in found:
        now = found[INSTALLED]
        if now is None:
            lines.append(f"{installed_unit} is missing: systemd does not run release {release_id}'s unit")
        elif now != unit:
            lines.append(f"{installed_unit} differs from release {release_id}'s unit (edited on the host)")
    return lines


def release_drift(
    conn: Connection, paths: ServicePaths, releases: Sequence[str], current: str | None
) -> dict[str, list[str]]:
    """Release id -> its differences (empty: none found), for each of `releases` whose manifest records file
    digests (one read of each manifest, one hashing command); the installed unit is compared for `current`."""
    recorded: dict[str, dict[str, str]] = {}
    for rid in dict.fromkeys(releases):
        try:
            manifest = release.Manifest.from_json(conn.get_text(f"{paths.release(rid)}/{release.MANIFEST}"))
        except OpsctlError:
            continue
        if manifest.files:
            recorded[rid] = manifest.files
    if not recorded:
        return {}
    names = {rid: sorted(files) for rid, files in recorded.items()}
    found = parse_hashes(conn.run(hash_cmd(paths, names), check=False).stdout)
    return {
        rid: differences(rid, files, found, paths.installed_unit if rid == current else "")
        for rid, files in recorded.items()
    }


def status_lines(conn: Connection, paths: ServicePaths, facts: release.ReleaseFacts) -> list[str]:
    """What `opsctl status` reports of a service's or router's releases: what changed on the host in the current
    release and (prefixed "rollback target ") in the rollback target since they were deployed."""
    target = facts.rollback_target()
    found = release_drift(conn, paths, [r for r in (facts.current, target) if r], facts.current)
    lines = list(found.get(facts.current or "", []))
    if target is not None and target != facts.current:
        lines += [f"rollback target {line}" for line in found.get(target, [])]
    return lines
