from datetime import UTC, datetime

import pytest

from opsctl import systemd, wheel
from opsctl.deploy import release
from opsctl.deploy.release import Manifest, ReleaseId, ServicePaths
from opsctl.errors import DeployError

NOW = datetime(2026, 11, 29, 22, 15, 0, tzinfo=UTC)


def test_config_hash_is_stable_and_sensitive():
    files = {"unit": "[Service]\nExecStart=x\n", "env": "A=1\n", "server.yaml": "port: 1\n"}
    h = release.config_hash(files, ("python", "-m", "ddtree.serve"), "abc")
    assert len(h) == 12 and all(c in "0123456789abcdef" for c in h)
    assert h == release.config_hash(dict(reversed(list(files.items()))), ("python", "-m", "ddtree.serve"), "abc")
    assert h != release.config_hash({**files, "env": "A=2\n"}, ("python", "-m", "ddtree.serve"), "abc")
    assert h != release.config_hash(files, ("python", "-m", "ddtree.serve", "--x"), "abc")
    assert h != release.config_hash(files, ("python", "-m", "ddtree.serve"), "abd")
    # a boundary shift between two files must change the hash
    assert release.config_hash({"a": "xy", "b": ""}, (), "") != release.config_hash({"a": "x", "b": "y"}, (), "")


def test_release_id_roundtrip_and_sorting():
    rid = release.new_release_id(NOW, "0123456789ab")
    assert rid == "20261129T221500Z-0123456789ab"
    parsed = ReleaseId.parse(rid)
    assert parsed.time == NOW and parsed.chash == "0123456789ab" and str(parsed) == rid
    later = release.new_release_id(datetime(2026, 11, 29, 22, 15, 1, tzinfo=UTC), "000000000000")
    assert sorted([later, rid]) == [rid, later]
    assert len(release.PLACEHOLDER_ID) == len(rid)


@pytest.mark.parametrize("bad", ["", "latest", "20261129T221500Z", "20261129T221500Z-XYZ", "2026-11-29-0123456789ab"])
def test_release_id_rejects_garbage(bad):
    with pytest.raises(DeployError, match="not a release id"):
        ReleaseId.parse(bad)


def test_new_release_id_needs_full_hash():
    with pytest.raises(ValueError):
        release.new_release_id(NOW, "abc")


def test_paths():
    p = ServicePaths("gpu0")
    assert p.current == "/opt/opsctl/services/gpu0/current"
    assert p.release("R") == "/opt/opsctl/services/gpu0/releases/R"
    assert p.release_unit("R") == "/opt/opsctl/services/gpu0/releases/R/opsctl-gpu0.service"
    assert p.release_file("R", "env") == "/opt/opsctl/services/gpu0/releases/R/env"
    assert p.release_file("R", "unit") == p.release_unit("R")
    assert p.installed_unit == "/etc/systemd/system/opsctl-gpu0.service"
    assert p.site("R") == "/opt/opsctl/services/gpu0/releases/R/site"


def test_manifest_roundtrip():
    m = Manifest(
        "20261129T221500Z-0123456789ab", "gpu0", "ct200", "tree", "sglang", "0123456789ab", "2026-11-29T22:15:00Z",
        "ddtree_runtime-0.1.0-py3-none-any.whl", "f" * 64, "0.1.0", "0.1.0", ("python", "-m", "x"), {"unit": "aa"},
    )  # fmt: skip
    assert Manifest.from_json(m.to_json()) == m
    with pytest.raises(DeployError, match="unreadable release manifest"):
        Manifest.from_json("{not json")
    with pytest.raises(DeployError):
        Manifest.from_json('{"release_id": "x"}')


def test_wheel_version():
    assert wheel.wheel_version("ddtree_runtime-0.1.0-py3-none-any.whl") == "0.1.0"
    assert wheel.wheel_version("weird.whl") == "unknown"


FACTS = """current /opt/opsctl/services/gpu0/releases/20261129T221500Z-bbbbbbbbbbbb
release 20261129T220000Z-aaaaaaaaaaaa 0 1
release 20261129T221500Z-bbbbbbbbbbbb 0 1
release 20261129T210000Z-cccccccccccc 1 1
release 20261129T223000Z-dddddddddddd 1 1
release 20261129T200000Z-eeeeeeeeeeee 0 0
release notarelease 0 1
garbage line
"""


def test_parse_release_facts():
    facts = release.parse_release_facts(FACTS)
    assert facts.current == "20261129T221500Z-bbbbbbbbbbbb"
    assert facts.current_hash == "bbbbbbbbbbbb"
    assert [r.release_id[:15] for r in facts.releases] == [
        "20261129T200000", "20261129T210000", "20261129T220000", "20261129T221500", "20261129T223000",
    ]  # fmt: skip
    assert facts.entry("20261129T210000Z-cccccccccccc").bad
    assert not facts.entry("20261129T200000Z-eeeeeeeeeeee").complete


def test_previous_good_skips_bad_and_incomplete():
    facts = release.parse_release_facts(FACTS)
    assert facts.previous_good() == "20261129T220000Z-aaaaaaaaaaaa"
    assert facts.previous_good("20261129T220000Z-aaaaaaaaaaaa") is None  # older ones are bad or incomplete


def test_rollback_target_is_what_served_before_current():
    # Deployed A(200000), B(210000), rolled back to A, deployed C(220000) over A: rolling C back means A, not B.
    a, b, c = "20261129T200000Z-aaaaaaaaaaaa", "20261129T210000Z-bbbbbbbbbbbb", "20261129T220000Z-cccccccccccc"
    lines = [f"current /opt/x/releases/{c}", f"previous {a}"] + [f"release {r} 0 1" for r in (a, b, c)]
    facts = release.parse_release_facts("\n".join(lines))
    assert facts.deployed_over == a and facts.rollback_target() == a
    assert facts.previous_good() == b  # what a newest-older rule would wrongly pick
    assert release.plan_prune(facts, keep=1) == [b]  # the rollback target survives pruning


def test_rollback_target_falls_back_when_the_recorded_one_is_bad_or_gone():
    a, b, c = "20261129T200000Z-aaaaaaaaaaaa", "20261129T210000Z-bbbbbbbbbbbb", "20261129T220000Z-cccccccccccc"
    head = [f"current releases/{c}", f"previous {a}"]
    bad_a = "\n".join([*head, f"release {a} 1 1", f"release {b} 0 1", f"release {c} 0 1"])
    assert release.parse_release_facts(bad_a).rollback_target() == b
    gone = "\n".join([f"current releases/{c}", f"previous {a}", f"release {b} 0 1", f"release {c} 0 1"])
    assert release.parse_release_facts(gone).rollback_target() == b
    none_recorded = "\n".join([f"current releases/{c}", "previous ", f"release {b} 0 1", f"release {c} 0 1"])
    facts = release.parse_release_facts(none_recorded)
    assert facts.deployed_over is None and facts.rollback_target() == b


def test_no_current():
    facts = release.parse_release_facts("current \n")
    assert facts.current is None and facts.current_hash is None and facts.releases == ()
    assert facts.previous_good() is None


def test_plan_prune_keeps_newest_and_current():
    facts = release.parse_release_facts(FACTS)
    doomed = release.plan_prune(facts, keep=2)
    # the two newest good ones are 221500 (current) and 220000; BAD and incomplete ones never count
    assert doomed == [
        "20261129T200000Z-eeeeeeeeeeee", "20261129T210000Z-cccccccccccc", "20261129T223000Z-dddddddddddd",
    ]  # fmt: skip
    old_current = release.ReleaseFacts("20261129T200000Z-eeeeeeeeeeee", facts.releases)
    assert "20261129T200000Z-eeeeeeeeeeee" not in release.plan_prune(old_current, keep=1)
    assert release.plan_prune(facts, keep=5) == doomed  # only good releases are kept, however many
    with pytest.raises(DeployError):
        release.plan_prune(facts, keep=0)


def test_plan_prune_never_counts_bad_or_incomplete_releases():
    # Five failed deploys after a good one must not push the good rollback targets out of --keep.
    good = [f"20261129T2{i}0000Z-{c * 12}" for i, c in enumerate("abc")]
    bad = [f"20261129T23{i}000Z-{c * 12}" for i, c in enumerate("def")]
    lines = [f"current releases/{good[-1]}", f"previous {good[-2]}"]
    lines += [f"release {r} 0 1" for r in good] + [f"release {r} 1 1" for r in bad[:2]] + [f"release {bad[2]} 0 0"]
    doomed = release.plan_prune(release.parse_release_facts("\n".join(lines)), keep=3)
    assert doomed == bad  # all three good ones stay; the BAD and the incomplete one go


def test_commands_exact():
    p = ServicePaths("gpu0")
    rid = "20261129T221500Z-0123456789ab"
    assert release.switch_cmd(p, rid).display() == (
        "sh -c 'ln -sfn releases/20261129T221500Z-0123456789ab /opt/opsctl/services/gpu0/current.tmp && "
        "mv -T /opt/opsctl/services/gpu0/current.tmp /opt/opsctl/services/gpu0/current'"
    )
    assert release.install_unit_cmd(p, rid).display() == (
        "install -m 0644 /opt/opsctl/services/gpu0/releases/20261129T221500Z-0123456789ab/opsctl-gpu0.service "
        "/etc/systemd/system/opsctl-gpu0.service"
    )
    assert release.pip_install_cmd("/opt/opsctl/venv", "/opt/opsctl/wheels/w.whl", p.site(rid)).display() == (
        "/opt/opsctl/venv/bin/python -m pip install --quiet --no-deps --no-index --disable-pip-version-check "
        "--target /opt/opsctl/services/gpu0/releases/20261129T221500Z-0123456789ab/site /opt/opsctl/wheels/w.whl"
    )
    assert release.switch_cmd(p, rid).sudo and systemd.verify_cmd(p.release_unit(rid)).sudo
    assert "2>&1" in systemd.verify_cmd(p.release_unit(rid)).display()
    assert (
        release.mark_bad_cmd(p, rid, "it's broken")
        .display()
        .endswith("/opt/opsctl/services/gpu0/releases/20261129T221500Z-0123456789ab/BAD'")
    )


HELP = """usage: ddtree-serve [-h] [--config FILE.yaml] --model-path MODEL_PATH
                    [--speculative-algorithm {DFLASH,DDTREE}] [--host HOST] [--port PORT]

options:
  -h, --help            show this help message and exit
  --disable-overlap-schedule
  --page-size PAGE_SIZE
  --tensor-parallel-size TP_SIZE, --tp-size TP_SIZE
"""


def test_preflight_flags():
    from opsctl.deploy import preflight

    flags = preflight.parse_help_flags(HELP)
    assert {"--config", "--model-path", "--speculative-algorithm", "--tp-size", "--help", "--page-size"} <= flags
    argv = ("--model-path", "/m", "--port=30000", "--tp-size", "2", "--no-such-flag", "--port", "1", "-x")
    assert preflight.used_flags(argv) == ["--model-path", "--port", "--tp-size", "--no-such-flag"]
    assert preflight.unknown_flags(argv, HELP) == ["--no-such-flag"]
    assert preflight.looks_like_help(HELP) and not preflight.looks_like_help("No module named ddtree")
    cmd = preflight.help_cmd("/opt/opsctl/venv", "ddtree.serve", "/opt/r/site")
    assert cmd.display() == "sh -c 'PYTHONPATH=/opt/r/site /opt/opsctl/venv/bin/python -m ddtree.serve --help 2>&1'"


def test_facts_script_runs_in_a_real_shell(tmp_path):
    """The facts script, run by sh against a real directory tree (paths moved under tmp_path)."""
    import subprocess

    p = ServicePaths("svc")
    root = tmp_path / "svc"
    layout = (
        ("20261129T220000Z-aaaaaaaaaaaa", True, True),
        ("20261129T221500Z-bbbbbbbbbbbb", False, True),
        ("20261129T223000Z-cccccccccccc", False, False),
    )
    for rid, bad, complete in layout:
        d = root / "releases" / rid
        d.mkdir(parents=True)
        if bad:
            (d / "BAD").write_text("why\n")
        if complete:
            (d / "manifest.json").write_text("{}")
    (root / "current").symlink_to("releases/20261129T221500Z-bbbbbbbbbbbb")
    script = release.facts_cmd(p).argv[2].replace(p.root, str(root))
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    facts = release.parse_release_facts(out)
    assert facts.current == "20261129T221500Z-bbbbbbbbbbbb"
    assert [(r.bad, r.complete) for r in facts.releases] == [(True, True), (False, True), (False, False)]
    # the switch command, for real: the symlink is replaced atomically and stays relative
    switch = release.switch_cmd(p, "20261129T220000Z-aaaaaaaaaaaa").argv[2].replace(p.root, str(root))
    subprocess.run(["sh", "-c", switch], check=True)
    assert (root / "current").readlink().as_posix() == "releases/20261129T220000Z-aaaaaaaaaaaa"


def test_model_manifests_enter_the_hash():
    paths = ["/dev/shm/tiny", "/dev/shm/tiny-draft/"]
    cmd = release.model_manifests_cmd(paths)
    assert cmd.display() == (
        "sh -c 'sha256sum /dev/shm/tiny/.opsctl-manifest.json /dev/shm/tiny-draft/.opsctl-manifest.json "
        "2>/dev/null || true'"
    )
    out = f"{'a' * 64}  /dev/shm/tiny/.opsctl-manifest.json\n"
    digests = release.parse_model_manifests(out, paths)
    assert digests == f"/dev/shm/tiny={'a' * 64};/dev/shm/tiny-draft=none"
    files = {"unit": "u"}
    assert release.config_hash(files, (), "w", digests) != release.config_hash(
        files, (), "w", digests.replace("a", "b")
    )
    assert release.config_hash(files, (), "w") == release.config_hash(files, (), "w", "")
