"""Every bad inventory gives exactly one line naming the problem, exit code 1, and no traceback."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_cli

GOOD_SERVICE = """
        gpus: [0]
        port: 30000
        mode: linear
        model: {source: /data/m, source_on: host, path: /dev/shm/m, hybrid: false}
        draft_model: {source: /data/d, source_on: host, path: /dev/shm/d}
"""


def host(services: str = "", extra: str = "", name: str = "h1", gpus: int = 2) -> str:
    block = f"""
hosts:
  {name}:
    address: 10.0.0.1
    gpus: {gpus}
{textwrap.indent(textwrap.dedent(extra).strip(), "    ") if extra.strip() else ""}
    services:
{textwrap.indent(textwrap.dedent(services).strip(), "      ") if services.strip() else "      {}"}
"""
    return block


def svc(name: str = "s1", body: str = GOOD_SERVICE) -> str:
    return f"{name}:\n" + textwrap.indent(textwrap.dedent(body).strip(), "  ")


def with_key(body: str, line: str) -> str:
    return textwrap.dedent(body).strip() + "\n" + line


TWO = svc("s1") + "\n" + svc("s2", GOOD_SERVICE.replace("30000", "30001").replace("[0]", "[1]"))

# (id, inventory text or None for a missing file, fragment the one line must contain)
CASES: list[tuple[str, str | None, str]] = [
    ("yaml-syntax", "hosts: [unclosed\n", "YAML syntax error at line"),
    ("yaml-tabs", "hosts:\n\tbad: 1\n", "YAML syntax error"),
    ("empty-file", "", "the inventory is empty"),
    ("only-comment", "# nothing\n", "the inventory is empty"),
    ("top-not-mapping", "- a\n- b\n", "expected a mapping, got a list"),
    ("no-hosts-key", "defaults: {}\n", "hosts: required key is missing"),
    ("hosts-empty", "hosts: {}\n", "no hosts defined"),
    ("unknown-top-key", "hostz: {}\nhosts: {}\n", "hostz: unknown key"),
    ("duplicate-key", "hosts:\n  a: {address: x}\n  a: {address: y}\n", "duplicate key 'a'"),
    ("missing-file", None, "not found"),
    ("host-bad-name", host(name="Bad_Name"), "hosts: 'Bad_Name' is not a safe name"),
    ("host-missing-address", "hosts:\n  h1: {gpus: 1}\n", "hosts.h1.address: required key is missing"),
    ("host-unknown-key", host(extra="adress: x"), "hosts.h1.adress: unknown key"),
    ("gpus-wrong-type", host(extra="", gpus="eight"), "hosts.h1.gpus: expected an integer, got a string"),  # type: ignore[arg-type]
    ("ssh-port-string", host(extra="ssh: {port: twenty-two}"), "hosts.h1.ssh.port: expected an integer"),
    (
        "ssh-bad-policy",
        host(extra="ssh: {host_key_policy: yolo}"),
        "host_key_policy: expected one of strict, accept-new",
    ),
    ("venv-relative", host(extra="venv: opt/venv"), "hosts.h1.venv: 'opt/venv' is not a safe absolute path"),
    ("venv-dotdot", host(extra="venv: /opt/../etc"), "must not contain '..'"),
    ("venv-shell", host(extra="venv: '/opt/v;rm -rf /'"), "is not a safe absolute path"),
    ("service-bad-name", host(svc("gpu 0")), "'gpu 0' is not a safe name"),
    (
        "service-unknown-key",
        host(svc(body=with_key(GOOD_SERVICE, "prot: 1"))),
        "services.s1.prot: unknown key (did you mean `port`?)",
    ),
    (
        "service-missing-port",
        host(svc(body=GOOD_SERVICE.replace("port: 30000", ""))),
        "services.s1.port: required key is missing",
    ),
    (
        "port-out-of-range",
        host(svc(body=GOOD_SERVICE.replace("30000", "99999"))),
        "services.s1.port: 99999 is out of range",
    ),
    (
        "bad-mode",
        host(svc(body=GOOD_SERVICE.replace("linear", "turbo"))),
        "services.s1.mode: expected one of baseline, linear, shadow, tree",
    ),
    (
        "bad-engine",
        host(svc(body=with_key(GOOD_SERVICE, "engine: vllm"))),
        "services.s1.engine: expected one of sglang, reference",
    ),
    (
        "duplicate-port",
        host(svc("s1") + "\n" + svc("s2", GOOD_SERVICE.replace("[0]", "[1]"))),
        "services.s2.port: 30000 already used by s1",
    ),
    (
        "gpu-clash",
        host(svc("s1") + "\n" + svc("s2", GOOD_SERVICE.replace("30000", "30001"))),
        "services.s2.gpus: GPU 0 already used by s1",
    ),
    (
        "gpu-out-of-range",
        host(svc(body=GOOD_SERVICE.replace("[0]", "[5]"))),
        "services.s1.gpus: GPU 5 does not exist (host has 2 GPUs)",
    ),
    ("gpu-not-int", host(svc(body=GOOD_SERVICE.replace("[0]", "[zero]"))), "services.s1.gpus[0]: expected an integer"),
    (
        "literal-api-key",
        host(svc(body=with_key(GOOD_SERVICE, "api_key: hunter2-literal"))),
        "services.s1.api_key: literal secrets are not allowed",
    ),
    (
        "secret-in-extra-env",
        host(svc(body=with_key(GOOD_SERVICE, "extra_env: {HF_TOKEN: abc123}"))),
        "extra_env.HF_TOKEN: looks like a secret",
    ),
    (
        "secret-in-extra-args",
        host(svc(body=with_key(GOOD_SERVICE, "extra_args: ['--api-key=abc']"))),
        "secrets must not be passed as arguments",
    ),
    (
        "unsafe-extra-arg",
        host(svc(body=with_key(GOOD_SERVICE, "extra_args: ['--x=$(reboot)']"))),
        "extra_args[0]: '--x=$(reboot)' is not a safe argument",
    ),
    (
        "reserved-env",
        host(svc(body=with_key(GOOD_SERVICE, "extra_env: {CUDA_VISIBLE_DEVICES: '3'}"))),
        "is set by opsctl itself",
    ),
    (
        "sglang-plugins-without-ddtree",
        host(svc(body=with_key(GOOD_SERVICE, "extra_env: {SGLANG_PLUGINS: 'other, more'}"))),
        "extra_env.SGLANG_PLUGINS: leaves out the ddtree plugin",
    ),
    (
        "test-hook-in-ddtree",
        host(svc(body=with_key(GOOD_SERVICE.replace("linear", "tree"), "ddtree: {replay_acceptance: /tmp/p.json}"))),
        "services.s1.ddtree.replay_acceptance: is a benchmark test hook (commits recorded paths",
    ),
    (
        "test-hook-in-extra-env",
        host(svc(body=with_key(GOOD_SERVICE, "extra_env: {DDTREE_RECORD_ROUNDS: /tmp/r.jsonl}"))),
        "extra_env.DDTREE_RECORD_ROUNDS: is a benchmark test hook (records every decode round",
    ),
    (
        "model-not-shm",
        host(svc(body=GOOD_SERVICE.replace("path: /dev/shm/m", "path: /tmp/m"))),
        "model.path: '/tmp/m' must be a directory under /dev/shm/",
    ),
    (
        "model-missing-path",
        host(svc(body=GOOD_SERVICE.replace(", path: /dev/shm/m", ""))),
        "services.s1.model.path: required key is missing",
    ),
    (
        "draft-missing",
        host(svc(body="\n".join(ln for ln in GOOD_SERVICE.splitlines() if "draft_model" not in ln))),
        "mode linear needs a draft model",
    ),
    (
        "budget-zero",
        host(svc(body=with_key(GOOD_SERVICE, "ddtree: {budget: 0}"))),
        "ddtree.budget: 0 is out of range (1..1024)",
    ),
    (
        "topk-huge",
        host(svc(body=with_key(GOOD_SERVICE, "ddtree: {topk: 1000}"))),
        "ddtree.topk: 1000 is out of range (1..64)",
    ),
    (
        "unsafe-bool-string",
        host(svc(body=with_key(GOOD_SERVICE, "ddtree: {allow_hybrid_unsafe: 'yes'}"))),
        "allow_hybrid_unsafe: expected true or false",
    ),
    ("sglang-on-cpu", host(svc(body=with_key(GOOD_SERVICE, "device: cpu"))), "the sglang engine needs a GPU"),
    (
        "bad-address",
        "hosts:\n  h1: {address: 'a b'}\n",
        "hosts.h1.address: 'a b' is not a valid IP address or hostname",
    ),
]


@pytest.mark.parametrize(("case", "text", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_inventory_is_one_line_exit_1(tmp_path: Path, case: str, text: str | None, expected: str) -> None:
    file = tmp_path / "inv.yaml"
    if text is not None:
        file.write_text(text)
    result = run_cli("render", "-i", str(file))
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert result.exit_code == 1, result.stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == ""


def test_table_has_at_least_30_cases() -> None:
    assert len(CASES) >= 30


def test_good_two_service_inventory_loads(tmp_path: Path) -> None:
    from opsctl.inventory.load import load_inventory

    file = tmp_path / "inv.yaml"
    file.write_text(host(TWO))
    inv = load_inventory(file)
    assert [s.port for s in inv.hosts[0].services] == [30000, 30001]
    assert inv.hosts[0].services[1].gpus == (1,)


def test_sglang_plugins_that_list_ddtree_are_kept(tmp_path: Path) -> None:
    from opsctl.inventory.load import load_inventory

    file = tmp_path / "inv.yaml"
    file.write_text(host(svc(body=with_key(GOOD_SERVICE, "extra_env: {SGLANG_PLUGINS: 'other, ddtree'}"))))
    assert load_inventory(file).hosts[0].services[0].extra_env == (("SGLANG_PLUGINS", "other, ddtree"),)


def test_reference_engine_tree_on_hybrid_is_exact_and_flat_only_when_asked(tmp_path: Path) -> None:
    body = GOOD_SERVICE.replace("linear", "tree").replace("hybrid: false", "hybrid: true")
    body = with_key(body.replace("gpus: [0]", "gpus: []"), "engine: reference\ndevice: cpu")
    exact = tmp_path / "exact.yaml"
    exact.write_text(host(svc(body=body)))
    result = run_cli("render", "-i", str(exact), "--out", str(tmp_path / "out1"))
    assert result.exit_code == 0, result.stderr
    assert "HYBRID UNSAFE" not in result.stderr
    flat = tmp_path / "flat.yaml"
    flat.write_text(host(svc(body=with_key(body, "ddtree: {allow_hybrid_unsafe: true}"))))
    result = run_cli("render", "-i", str(flat), "--out", str(tmp_path / "out2"))
    assert result.exit_code == 0, result.stderr
    assert "HYBRID UNSAFE" in result.stderr


def test_sglang_tree_budget_beyond_the_draft_block_warns(tmp_path: Path) -> None:
    body = with_key(GOOD_SERVICE.replace("linear", "tree"), "ddtree: {budget: 64}")
    inv = tmp_path / "inv.yaml"
    inv.write_text(host(svc(body=body)))
    result = run_cli("render", "-i", str(inv), "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    assert "ddtree.budget: 64 does not fit SGLang's tree worker" in result.stderr
    inv.write_text(host(svc(body=with_key(GOOD_SERVICE.replace("linear", "tree"), "ddtree: {budget: 15}"))))
    result = run_cli("render", "-i", str(inv), "--out", str(tmp_path / "out2"))
    assert result.exit_code == 0 and "does not fit" not in result.stderr, result.stderr


def test_sglang_tree_on_hybrid_is_exact_with_cuda_graphs(tmp_path: Path) -> None:
    """SGLang's GDN tree path replays from the verify graphs (measured exact on the H200, docs/sglang.md), so a
    hybrid tree service keeps SGLang's CUDA graphs and renders no warning."""
    body = with_key(
        GOOD_SERVICE.replace("linear", "tree").replace("hybrid: false", "hybrid: true"), "ddtree: {budget: 15}"
    )
    inv = tmp_path / "inv.yaml"
    inv.write_text(host(svc(body=body)))
    result = run_cli("render", "-i", str(inv), "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    assert "CUDA graphs" not in result.stderr and "HYBRID UNSAFE" not in result.stderr, result.stderr
    unit = next((tmp_path / "out").rglob("*.service")).read_text()
    config = next((tmp_path / "out").rglob("server.yaml")).read_text()
    assert "disable-cuda-graph" not in config, config + unit
    assert "DDTREE_VERIFY=tree\n" in next((tmp_path / "out").rglob("env")).read_text()
    # the unsafe knob does nothing here (the verify is exact) and says so
    inv.write_text(
        host(
            svc(
                body=with_key(
                    body.replace("ddtree: {budget: 15}", ""), "ddtree: {budget: 15, allow_hybrid_unsafe: true}"
                )
            )
        )
    )
    result = run_cli("render", "-i", str(inv), "--out", str(tmp_path / "out2"))
    assert result.exit_code == 0 and "allow_hybrid_unsafe has no effect" in result.stderr, result.stderr
    assert "HYBRID UNSAFE" not in result.stderr


def test_sglang_tree_budget_beyond_the_block_renders_an_eager_verify(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(host(svc(body=with_key(GOOD_SERVICE.replace("linear", "tree"), "ddtree: {budget: 24}"))))
    result = run_cli("render", "-i", str(inv), "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.stderr
    assert "verifies them in a 2 * block window without CUDA graphs" in result.stderr
    assert "disable-cuda-graph: true" in next((tmp_path / "out").rglob("server.yaml")).read_text()
    hybrid = GOOD_SERVICE.replace("linear", "tree").replace("hybrid: false", "hybrid: true")
    inv.write_text(host(svc(body=with_key(hybrid, "ddtree: {budget: 24}"))))
    result = run_cli("render", "-i", str(inv), "--out", str(tmp_path / "out2"))
    assert result.exit_code == 0, result.stderr
    assert "does not fit SGLang's tree worker (budget <= 15 for 16-token DFlash drafters on a hybrid target)" in (
        result.stderr
    )


def test_selfcheck_renders_for_sglang_tree_and_warns_where_it_does_nothing(tmp_path: Path) -> None:
    tree = with_key(GOOD_SERVICE.replace("linear", "tree"), "ddtree: {budget: 7, selfcheck_every: 50}")
    inv = tmp_path / "inv.yaml"
    inv.write_text(host(svc(body=tree)))
    result = run_cli("render", "-i", str(inv), "--out", str(tmp_path / "out"))
    assert result.exit_code == 0 and "selfcheck_every" not in result.stderr, result.stderr
    env = next((tmp_path / "out").rglob("env")).read_text()
    assert "DDTREE_SELFCHECK_EVERY=50\n" in env and "DDTREE_VERIFY=tree\n" in env
    shadow = with_key(GOOD_SERVICE.replace("linear", "shadow"), "ddtree: {selfcheck_every: 50}")
    inv.write_text(host(svc(body=shadow)))
    result = run_cli("render", "-i", str(inv), "--out", str(tmp_path / "out2"))
    assert result.exit_code == 0, result.stderr
    assert "ddtree.selfcheck_every has no effect" in result.stderr and "mode shadow" in result.stderr
    assert "DDTREE_SELFCHECK_EVERY" not in next((tmp_path / "out2").rglob("env")).read_text()
    inv.write_text(host(svc(body=with_key(GOOD_SERVICE, "ddtree: {selfcheck_every: -1}"))))
    result = run_cli("render", "-i", str(inv), "--out", str(tmp_path / "out3"))
    assert result.exit_code == 1 and "selfcheck_every" in result.stderr


def test_round_graphs_max_bs_renders_for_sglang_tree_and_is_validated_whole(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    tree = with_key(GOOD_SERVICE.replace("linear", "tree"), "ddtree: {budget: 7, round_graphs_max_bs: 32}")
    inv.write_text(host(svc(body=tree)))
    result = run_cli("render", "-i", str(inv), "--out", str(tmp_path / "out"))
    assert result.exit_code == 0 and "has no effect" not in result.stderr, result.stderr
    assert "DDTREE_ROUND_GRAPHS_MAX_BS=32\n" in next((tmp_path / "out").rglob("env")).read_text()
    inv.write_text(host(svc(body=with_key(GOOD_SERVICE, "ddtree: {round_graphs_max_bs: 32}"))))  # linear
    result = run_cli("render", "-i", str(inv), "--out", str(tmp_path / "out2"))
    assert result.exit_code == 0 and "ddtree.round_graphs_max_bs has no effect" in result.stderr
    assert "DDTREE_ROUND_GRAPHS_MAX_BS" not in next((tmp_path / "out2").rglob("env")).read_text()
    for bad in ("-1", "2000", "true", '"32"', '"32\\n"', "[32]"):
        body = with_key(GOOD_SERVICE.replace("linear", "tree"), f"ddtree: {{budget: 7, round_graphs_max_bs: {bad}}}")
        inv.write_text(host(svc(body=body)))
        result = run_cli("render", "-i", str(inv), "--out", str(tmp_path / "bad"))
        assert result.exit_code == 1 and "ddtree.round_graphs_max_bs" in result.stderr, (bad, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_dense_sglang_tree_keeps_cuda_graphs_on_triton_only(tmp_path: Path) -> None:
    """Its verify graphs read the tree mask on triton (ddtree.sglang.graph_masks); another attention backend's
    graphs would verify the tree causally, so that one renders eager. Other modes keep SGLang's CUDA graphs."""
    inv = tmp_path / "inv.yaml"
    tree = GOOD_SERVICE.replace("linear", "tree")
    cases = [
        ("tree", "ddtree: {budget: 7}", False),
        ("flashinfer", "ddtree: {budget: 7}\nattention_backend: flashinfer", True),
    ]
    for name, extra, eager in cases:
        inv.write_text(host(svc(body=with_key(tree, extra))))
        result = run_cli("render", "-i", str(inv), "--out", str(tmp_path / name))
        assert result.exit_code == 0 and "without CUDA graphs" not in result.stderr, result.stderr
        config = next((tmp_path / name).rglob("server.yaml")).read_text()
        assert ("disable-cuda-graph: true" in config) is eager, config
    for mode in ("linear", "shadow"):
        inv.write_text(host(svc(body=GOOD_SERVICE.replace("linear", mode))))
        assert run_cli("render", "-i", str(inv), "--out", str(tmp_path / mode)).exit_code == 0
        assert "disable-cuda-graph" not in next((tmp_path / mode).rglob("server.yaml")).read_text()
