"""ddtree.config (DDTREE_* environment) and ddtree.metrics (the exact DDTREE log lines)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from ddtree import __version__
from ddtree.config import DDTreeConfig, FusedBuild, HybridMode
from ddtree.metrics import MetricsLog, RoundStats, format_metrics, summarize
from ddtree.modes import Mode

pytestmark = pytest.mark.runtime

# --------------------------------------------------------------------------------------- config


def test_defaults_from_an_empty_environment():
    config = DDTreeConfig.from_env({"PATH": "/usr/bin"})
    assert config == DDTreeConfig(verify=Mode.TREE, budget=32, topk=8, allow_hybrid_unsafe=False, log_interval=50)
    assert config.verify == "tree"


def test_good_values():
    env = {
        "DDTREE_VERIFY": "shadow",
        "DDTREE_BUDGET": "64",
        "DDTREE_TOPK": " 4 ",
        "DDTREE_ALLOW_HYBRID_UNSAFE": "1",
        "DDTREE_LOG_INTERVAL": "10",
    }
    config = DDTreeConfig.from_env(env)
    assert config == DDTreeConfig(verify=Mode.SHADOW, budget=64, topk=4, allow_hybrid_unsafe=True, log_interval=10)
    assert DDTreeConfig.from_env(config.to_env()) == config


def test_empty_values_take_the_default():
    env = {k: "" for k in DDTreeConfig().to_env()}
    assert DDTreeConfig.from_env(env) == DDTreeConfig()


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("DDTREE_VERIFY", "linear", "DDTREE_VERIFY='linear': expected one of shadow, tree"),
        ("DDTREE_BUDGET", "abc", "DDTREE_BUDGET='abc': expected an integer >= 1"),
        ("DDTREE_BUDGET", "0", "DDTREE_BUDGET='0': expected an integer >= 1"),
        ("DDTREE_BUDGET", "-3", "DDTREE_BUDGET='-3': expected an integer >= 1"),
        ("DDTREE_TOPK", "1.5", "DDTREE_TOPK='1.5': expected an integer >= 1"),
        ("DDTREE_ALLOW_HYBRID_UNSAFE", "yes", "DDTREE_ALLOW_HYBRID_UNSAFE='yes': expected 0 or 1"),
        ("DDTREE_LOG_INTERVAL", "0", "DDTREE_LOG_INTERVAL='0': expected an integer >= 1"),
        ("DDTREE_VERIFY", "baseline", "DDTREE_VERIFY='baseline': expected one of shadow, tree"),
        ("DDTREE_TEST_POLICY", "fast", "DDTREE_TEST_POLICY='fast': expected phased (or unset)"),
    ],
)
def test_bad_values_raise_one_line(key: str, value: str, expected: str):
    with pytest.raises(ValueError) as excinfo:
        DDTreeConfig.from_env({key: value})
    assert str(excinfo.value) == expected


def test_direct_construction_is_validated():
    with pytest.raises(ValueError, match="budget"):
        DDTreeConfig(budget=0)
    assert DDTreeConfig(verify="shadow").verify is Mode.SHADOW  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"DDTreeConfig\.verify='linear': expected one of shadow, tree"):
        DDTreeConfig(verify=Mode.LINEAR)  # a mode that builds no tree


def test_test_hooks_are_config_fields_read_once_with_the_rest(tmp_path: Path) -> None:
    rounds = str(tmp_path / "rounds.jsonl")
    env = {"DDTREE_TEST_POLICY": "phased", "DDTREE_RECORD_ROUNDS": rounds, "DDTREE_POLICY": "auto"}
    config = DDTreeConfig.from_env(env)
    assert (config.test_policy, config.record_rounds) == ("phased", rounds)
    assert DDTreeConfig.from_env(config.to_env()) == config
    assert "DDTREE_TEST_POLICY" not in DDTreeConfig().to_env()  # production renders no hook


# --------------------------------------------------------------------------------------- metrics

R1 = RoundStats(
    accepted_len=3,
    nodes=32,
    depth=5,
    off_spine=False,
    draft_ms=1.5,
    build_ms=0.25,
    verify_ms=10.0,
    commit_ms=0.25,
    width=8,
)
R2 = RoundStats(
    accepted_len=5,
    nodes=30,
    depth=7,
    off_spine=True,
    draft_ms=2.5,
    build_ms=0.75,
    verify_ms=12.0,
    commit_ms=0.75,
    width=6,
)
METRICS_KEYS = [
    "rounds",
    "tokens",
    "tau",
    "nodes",
    "depth",
    "off_spine",
    "draft_ms",
    "build_ms",
    "verify_ms",
    "commit_ms",
    "tok_s",
    "width",
]


def ddtree_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ddtree"]


def test_log_lines_exact(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="ddtree")
    log = MetricsLog(DDTreeConfig(budget=32, topk=8, log_interval=2), block_size=16, hybrid="exact")
    log.start()
    for stats in (R1, R2, R1):
        log.record(stats)
    log.flush()
    assert log.flush() is None  # nothing pending
    assert ddtree_lines(caplog) == [
        f"DDTREE init mode=tree budget=32 topk=8 block=16 hybrid=exact log_interval=2 version={__version__}",
        "DDTREE verify completed accept_length=3 nodes=32",
        "DDTREE metrics rounds=2 tokens=8 tau=4.000 nodes=31.000 depth=6.000 off_spine=0.500 draft_ms=2.000 "
        "build_ms=0.500 verify_ms=11.000 commit_ms=0.500 tok_s=285.714 width=7.000",
        "DDTREE metrics rounds=3 tokens=11 tau=3.000 nodes=32.000 depth=5.000 off_spine=0.000 draft_ms=1.500 "
        "build_ms=0.250 verify_ms=10.000 commit_ms=0.250 tok_s=250.000 width=8.000",
    ]


def test_unsafe_marks_every_metrics_line(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="ddtree")
    log = MetricsLog(DDTreeConfig(verify=Mode.SHADOW, log_interval=1), 16, HybridMode.UNSAFE)
    log.start()
    log.record(R1)
    log.record(R2)
    init, verify, *metrics = ddtree_lines(caplog)
    assert init.startswith("DDTREE init mode=shadow budget=32 topk=8 block=16 hybrid=unsafe ")
    assert verify == "DDTREE verify completed accept_length=3 nodes=32"
    assert len(metrics) == 2
    assert all(line.endswith(" hybrid=unsafe") for line in metrics)


def test_metrics_keys_are_stable_and_parse_as_key_value():
    line = format_metrics(summarize([R1, R2], 2, 8), HybridMode.NONE)
    assert line.startswith("DDTREE metrics ")
    pairs = [p.split("=", 1) for p in line.removeprefix("DDTREE metrics ").split(" ")]
    assert [k for k, _ in pairs] == METRICS_KEYS
    values = dict(pairs)
    assert values["rounds"] == "2" and values["tokens"] == "8"
    assert all(len(values[k].split(".")[1]) == 3 for k in METRICS_KEYS[2:])  # fixed 3 decimals


def test_zero_time_window_reports_zero_throughput():
    zero = RoundStats(2, 4, 2, False, 0.0, 0.0, 0.0, 0.0)
    summary = summarize([zero], 1, 2)
    assert summary.tok_s == 0.0 and summary.tau == 2.0 and summary.width == 0.0
    with pytest.raises(ValueError):
        summarize([], 0, 0)


def test_the_benchmark_hooks_read_once_and_round_trip() -> None:
    config = DDTreeConfig.from_env({"DDTREE_REPLAY_ACCEPTANCE": " /tmp/p.json ", "DDTREE_RECORD_PATHS": ""})
    assert (config.replay_acceptance, config.record_paths) == ("/tmp/p.json", "")
    assert config.to_env()["DDTREE_REPLAY_ACCEPTANCE"] == "/tmp/p.json" and "DDTREE_RECORD_PATHS" not in config.to_env()
    assert DDTreeConfig.from_env(config.to_env()) == config
    assert "DDTREE_REPLAY_ACCEPTANCE" not in DDTreeConfig().to_env()  # production: absent


# --------------------------------------------------------------------------------------- the tree planner switch


@pytest.mark.parametrize(
    ("raw", "setting"),
    [
        (None, FusedBuild.AUTO),
        ("", FusedBuild.AUTO),
        ("auto", FusedBuild.AUTO),
        ("0", FusedBuild.OFF),
        ("1", FusedBuild.ON),
    ],
)
def test_the_planner_switch_is_a_config_field(raw: str | None, setting: FusedBuild) -> None:
    config = DDTreeConfig.from_env({} if raw is None else {"DDTREE_FUSED_BUILD": raw})
    assert config.fused_build is setting
    assert DDTreeConfig.from_env(config.to_env()) == config
    assert ("DDTREE_FUSED_BUILD" in config.to_env()) is (setting is not FusedBuild.AUTO)
    with pytest.raises(ValueError, match=r"^DDTREE_FUSED_BUILD='yes': expected 0, 1 or auto$"):
        DDTreeConfig.from_env({"DDTREE_FUSED_BUILD": "yes"})


def test_the_planner_is_decided_by_the_setting_not_by_the_environment_at_each_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    fused_tree = pytest.importorskip("ddtree.fused_tree")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(fused_tree, "kernels", lambda: object())  # as if triton were importable
    monkeypatch.setattr(fused_tree, "triton_interpreted", lambda: False)
    assert fused_tree.fused_available(cuda, 8, FusedBuild.AUTO) and not fused_tree.fused_available(
        cpu, 8, FusedBuild.AUTO
    )
    assert not fused_tree.fused_available(cuda, 8, FusedBuild.OFF) and not fused_tree.fused_available(
        cpu, 8, FusedBuild.ON
    )
    assert not fused_tree.fused_available(cuda, fused_tree.MAX_TOPK + 1, FusedBuild.AUTO)
    monkeypatch.setattr(fused_tree, "triton_interpreted", lambda: True)
    assert fused_tree.fused_available(cpu, 8, FusedBuild.ON) and not fused_tree.fused_available(cpu, 8, FusedBuild.AUTO)
    # no setting given: this process's configuration, read once; a later change of the environment is not seen
    monkeypatch.setattr(fused_tree, "process_config", lambda: DDTreeConfig(fused_build=FusedBuild.OFF))
    monkeypatch.setenv("DDTREE_FUSED_BUILD", "1")
    assert not fused_tree.fused_available(cuda, 8)


def test_the_process_configuration_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    config_module = pytest.importorskip("ddtree.config")
    config_module.process_config.cache_clear()
    try:
        monkeypatch.setenv("DDTREE_BUDGET", "12")
        first = config_module.process_config()
        monkeypatch.setenv("DDTREE_BUDGET", "13")
        assert config_module.process_config() is first and first.budget == 12
    finally:
        config_module.process_config.cache_clear()
