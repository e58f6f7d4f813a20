"""The DDTREE SGLang plugin: pure gates and shadow statistics, then contract tests against SGLang 0.5.23's
real code (entry-point discovery, its plugin loader, its algorithm registry, the signatures we rely on, the
gates on real ServerArgs). SGLang is imported only in a subprocess (tests/runtime/sglang_cpu.py says why);
the contract tests skip, with the reason, only when sglang is not installed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from ddtree.config import DDTreeConfig, HybridMode
from ddtree.modes import Mode
from ddtree.sglang import compat
from ddtree.sglang.gates import GateError, ServerFacts, check_server, hybrid_mode
from ddtree.sglang.shadow import DraftObservation, observe_draft
from ddtree.stats import round_stats
from ddtree.tree import build_tree, tree_shape

pytestmark = pytest.mark.runtime

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sglang_cpu import Probe, ProbeResult  # noqa: E402

sys.path.remove(str(HERE))

SHADOW_ENV = {"DDTREE_VERIFY": "shadow", "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER": "1"}
GOOD = ServerFacts(
    page_size=1,
    disable_overlap_schedule=True,
    attention_backend="triton",
    prefill_attention_backend=None,
    decode_attention_backend=None,
    use_rejection_sampling=False,
    accept_threshold_single=1.0,
    accept_threshold_acc=1.0,
    draft_model_path="/dev/shm/draft",
)
SHADOW = DDTreeConfig(verify=Mode.SHADOW)
TREE = DDTreeConfig(verify=Mode.TREE)


# ---------------------------------------------------------------------------------------------------
# Pure: gates
# ---------------------------------------------------------------------------------------------------


def test_good_shadow_server_passes() -> None:
    check_server(GOOD, SHADOW, SHADOW_ENV)
    check_server(replace(GOOD, attention_backend="flashinfer"), SHADOW, SHADOW_ENV)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"page_size": 16}, "--page-size must be 1 (got 16)"),
        ({"page_size": None}, "--page-size must be 1 (got None)"),
        ({"disable_overlap_schedule": False}, "pass --disable-overlap-schedule"),
        ({"attention_backend": None}, "pass --attention-backend triton"),
        ({"attention_backend": "fa3"}, "--attention-backend fa3 cannot take the tree mask"),
        ({"decode_attention_backend": "trtllm_mha"}, "--decode-attention-backend trtllm_mha cannot take"),
        ({"use_rejection_sampling": True}, "--speculative-use-rejection-sampling is not supported"),
        ({"accept_threshold_single": 0.9}, "must stay 1.0"),
        ({"draft_model_path": None}, "pass --speculative-draft-model-path"),
    ],
)
def test_each_gate_refuses_with_one_clear_line(change: dict[str, Any], message: str) -> None:
    with pytest.raises(GateError) as err:
        check_server(replace(GOOD, **change), SHADOW, SHADOW_ENV)
    text = str(err.value)
    assert text.startswith("DDTREE: ") and message in text and "\n" not in text


def test_tree_mode_passes_the_start_gates_and_shadow_needs_the_eager_head() -> None:
    check_server(GOOD, TREE, {"DDTREE_VERIFY": "tree"})  # the tree worker reads its own eager head
    with pytest.raises(GateError, match="set SGLANG_DFLASH_EAGER_DRAFT_SAMPLER=1"):
        check_server(GOOD, SHADOW, {"DDTREE_VERIFY": "shadow"})


def test_hybrid_mode() -> None:
    unsafe_ok = DDTreeConfig(verify=Mode.TREE, allow_hybrid_unsafe=True)
    assert hybrid_mode(TREE, is_hybrid=False, exact_tree_path=False) is HybridMode.NONE
    assert hybrid_mode(SHADOW, is_hybrid=True, exact_tree_path=False) is HybridMode.EXACT
    assert hybrid_mode(TREE, is_hybrid=True, exact_tree_path=True) is HybridMode.EXACT
    assert hybrid_mode(unsafe_ok, is_hybrid=True, exact_tree_path=False) is HybridMode.UNSAFE
    with pytest.raises(GateError, match="DDTREE_ALLOW_HYBRID_UNSAFE=1"):
        hybrid_mode(TREE, is_hybrid=True, exact_tree_path=False)


# ---------------------------------------------------------------------------------------------------
# Pure: shadow statistics (the side path of the shadow worker), on CPU tensors
# ---------------------------------------------------------------------------------------------------


def test_observe_draft_builds_the_same_trees_as_ddtree() -> None:
    g = torch.Generator().manual_seed(0)
    bs, block, hidden, vocab = 3, 6, 16, 40
    config = DDTreeConfig(verify=Mode.SHADOW, budget=9, topk=3)
    hs = torch.randn(bs * (block - 1), hidden, generator=g)  # [bs * rows, H]
    weight = torch.randn(vocab, hidden, generator=g)  # [V, H]
    argmax = (hs @ weight.T).argmax(-1)  # what DFLASH's head returns
    obs = observe_draft(hs, weight, argmax, block, config)
    lp = (hs @ weight.T).log_softmax(-1).view(bs, block - 1, vocab)
    shapes = [tree_shape(build_tree(lp[b], 0, config.budget, config.topk)) for b in range(bs)]
    assert obs.nodes == [s.nodes for s in shapes] == [9, 9, 9]
    assert obs.depth == [s.depth for s in shapes]
    assert obs.width == [s.width for s in shapes]
    assert obs.spine_matches
    wrong = argmax.clone()
    wrong[4] = (wrong[4] + 1) % vocab
    assert not observe_draft(hs, weight, wrong, block, config).spine_matches


def test_round_stats_feed_the_metrics_contract() -> None:
    obs = DraftObservation(nodes=[9, 7], depth=[5, 4], width=[3, 2], spine_matches=True, build_ms=2.0)
    stats = round_stats([4, 1], obs.shapes, [False, False], obs.round_times(round_ms=10.0))
    assert [s.accepted_len for s in stats] == [4, 1]
    assert [(s.nodes, s.depth, s.width) for s in stats] == [(9, 5, 3), (7, 4, 2)]
    assert not any(s.off_spine for s in stats)
    assert math.isclose(sum(s.build_ms for s in stats), 2.0)
    assert math.isclose(sum(s.verify_ms for s in stats), 8.0)


def test_importing_the_plugin_package_never_imports_sglang() -> None:
    """The plugin's modules import SGLang only when SGLang asks for a worker (`ddtree.sglang.tree_worker`, which
    defines the worker class, is imported then), so opsctl's checks and the tests run without it."""
    code = (
        "import sys, ddtree.sglang, ddtree.sglang.plugin, ddtree.sglang.gates, ddtree.sglang.layout, "
        "ddtree.sglang.shadow, ddtree.sglang.tree_round, ddtree.sglang.request_kinds, ddtree.sglang.selfcheck, "
        "ddtree.sglang.bench_hooks; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sglang'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------------
# Contract: SGLang 0.5.23's real code, in the tier's one SGLang probe process (conftest.py, `sglang_probes`)
# ---------------------------------------------------------------------------------------------------

# Every SGLang symbol the plugin relies on, with its parameters in order, and the fields it reads by name: the
# plugin's own signature table (ddtree.sglang.compat), checked here against the installed SGLang's real code. A
# version bump that renames or reorders one fails here, not on a production host.
SIGNATURES = compat.SIGNATURES
FIELDS = compat.FIELDS

_PROBE = r"""
import importlib, inspect, json, os, sys, traceback
from importlib.metadata import entry_points
req = json.load(open(sys.argv[1]))
out = {}

# graph_masks' capture policy switch on SGLang's real dflash_utils: read first (nothing switched it yet); the
# switch itself is made last, so nothing else in this probe runs with it
import sglang.srt.speculative.dflash_utils as du
from ddtree.sglang.graph_masks import capture_with_tree_masks, captured_with_tree_masks
TritonAttnBackend = type("TritonAttnBackend", (), {"verify_mask": object()})
FlashInferAttnBackend = type("FlashInferAttnBackend", (), {"verify_mask": object()})
def _captured():
    return [captured_with_tree_masks(du, TritonAttnBackend()), captured_with_tree_masks(du, FlashInferAttnBackend())]
graph_masks = {"before": _captured()}

eps = [(e.name, e.value, e.dist.name if e.dist else None) for e in entry_points(group="sglang.srt.plugins")]
out["entry_points"] = eps
from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins, load_plugins_by_group
out["group"] = GENERAL_PLUGINS_GROUP
found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
out["loaded"] = {k: [f"{f.__module__}:{f.__qualname__}", d] for k, (f, d) in found.items()}
load_plugins()  # runs register() exactly as SGLang does (exceptions are logged, so check the registry)
load_plugins()  # idempotent

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import CustomSpecAlgo, get_spec
from sglang.srt.arg_groups import resolution_hooks
algo = SpeculativeAlgorithm.from_string("ddtree")
out["algo"] = {
    "repr": repr(algo), "is_custom": isinstance(algo, CustomSpecAlgo), "same": algo is get_spec("DDTREE"),
    "supports_overlap": algo.supports_overlap,
    "answers": {m: getattr(algo, m)() for m in ("is_dflash", "is_dflash_family", "is_eagle", "is_speculative",
                "supports_target_verify_for_draft", "need_topk", "has_draft_kv")},
    "missing_enum_methods": sorted(
        n for n, v in vars(SpeculativeAlgorithm).items()
        if callable(v) and not n.startswith("_") and n not in ("register", "from_string") and not hasattr(algo, n)
    ),
}
out["resolution_hooks"] = {k: [f"{f.__module__}:{f.__qualname__}" for f in v]
                           for k, v in resolution_hooks._HOOKS.items()}

def params(path):
    mod, attr = path.split(":")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj, part)
    if isinstance(obj, (classmethod, staticmethod)):
        obj = obj.__func__
    return list(inspect.signature(obj).parameters)

sigs = {}
for path in req["signatures"]:
    try:
        sigs[path] = params(path)
    except Exception as e:
        sigs[path] = f"{type(e).__name__}: {e}"
out["signatures"] = sigs
fields = {}
for path, names in req["fields"].items():
    mod, attr = path.split(":")
    cls = getattr(importlib.import_module(mod), attr)
    have = set(getattr(cls, "__struct_fields__", ()) or getattr(cls, "__dataclass_fields__", {}))
    fields[path] = sorted(n for n in names if n not in have)
out["missing_fields"] = fields
from sglang.srt.environ import envs
out["eager_sampler_env"] = hasattr(envs, "SGLANG_DFLASH_EAGER_DRAFT_SAMPLER")

from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.srt.arg_groups.overrides import record_foreign_defaults, resolving_view
from sglang.srt.arg_groups.resolution_hooks import run_hook
from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding

def gate(case):
    os.environ.clear(); os.environ.update(req["base_env"]); os.environ.update(case.get("env", {}))
    sa = ServerArgs(**{**req["good_args"], **case.get("args", {})})
    try:
        # exactly how handle_speculative_decoding calls a registered validator
        record_foreign_defaults(sa, "handle_speculative_decoding.custom_validate", algo.validate_server_args)
        return "ok"
    except ValueError as e:
        return f"ValueError: {e}"

out["gates"] = {name: gate(case) for name, case in req["gate_cases"].items()}

os.environ.clear(); os.environ.update(req["base_env"])
sa = ServerArgs(**req["good_args"])
run_hook(handle_speculative_decoding, sa)  # SGLang's own pipeline step, with our resolution hook around it
v = resolving_view(sa)
out["resolved"] = {f: getattr(v, f) for f in ("speculative_algorithm", "speculative_num_steps",
                   "speculative_eagle_topk", "speculative_num_draft_tokens", "max_running_requests")}
bad = ServerArgs(**{**req["good_args"], "page_size": 4})
try:
    run_hook(handle_speculative_decoding, bad)
    out["pipeline_bad_page_size"] = "ok"
except ValueError as e:
    out["pipeline_bad_page_size"] = f"ValueError: {e}"

cli = prepare_server_args(req["argv"])
out["cli"] = {"speculative_algorithm": cli.speculative_algorithm, "page_size": cli.page_size,
              "disable_overlap_schedule": cli.disable_overlap_schedule, "attention_backend": cli.attention_backend}
try:
    record_foreign_defaults(cli, "cli", algo.validate_server_args); out["cli_gate"] = "ok"
except ValueError as e:
    out["cli_gate"] = f"ValueError: {e}"

# a process reads its configuration once (process_config): each change of the environment below starts over
from ddtree.config import process_config
process_config.cache_clear()
worker = algo.create_worker(sa)  # SGLang's create_worker -> our factory -> the worker class
out["worker_mro"] = [f"{c.__module__}:{c.__qualname__}" for c in worker.__mro__[:3]]
os.environ["DDTREE_VERIFY"] = "tree"
out["cached_config_worker"] = algo.create_worker(sa).__qualname__  # the environment was read already
process_config.cache_clear()
tree_worker = algo.create_worker(sa)
out["tree_worker_mro"] = [f"{c.__module__}:{c.__qualname__}" for c in tree_worker.__mro__[:3]]
os.environ.clear(); os.environ.update(req["base_env"]); process_config.cache_clear()
try:
    algo.create_worker(ServerArgs(**{**req["good_args"], "disable_overlap_schedule": False}))
    out["overlap_create_worker"] = "ok"
except ValueError as e:
    out["overlap_create_worker"] = f"ValueError: {e}"

# The shadow worker's override around DFLASH's real eager head, on CPU tensors: the instance skips
# DFlashWorkerV2.__init__ (it loads models), the head method is SGLang's own code.
import logging, torch
from ddtree.config import DDTreeConfig
from ddtree.metrics import MetricsLog
cls = worker
w = cls.__new__(cls)
w.block_size = 6
w._ddtree_config = DDTreeConfig.from_env({"DDTREE_VERIFY": "shadow", "DDTREE_BUDGET": "9", "DDTREE_TOPK": "3"})
w._ddtree_log = MetricsLog(w._ddtree_config, 6, "none", logger=logging.getLogger("ddtree.probe"))
w._ddtree_obs, w._ddtree_enabled = None, True
g = torch.Generator().manual_seed(0)
head = torch.nn.Linear(16, 40, bias=False)  # a dense, unsharded LM head: weight [V, H]
hs = torch.randn(2 * 5, 16, generator=g)  # [bs * (block - 1), H]
with torch.no_grad():
    tokens = w._greedy_sample_from_vocab_parallel_head(hidden_states=hs, lm_head=head)
    expected = (hs @ head.weight.T).argmax(-1)
obs = w._ddtree_obs
# SGLang's own ParallelLMHead at TP=1: padded weight and `shard_indices` always set (a real instance needs
# SGLang's parallel state; the attributes are what the worker reads, from the same class).
from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbeddingShardIndices as Shard
padded = torch.nn.Linear(16, 48, bias=False)
with torch.no_grad():
    padded.weight[40:] = 0.0
    padded.weight[:40] = head.weight
padded.tp_size = 1
padded.shard_indices = Shard(
    padded_org_vocab_start_index=0, padded_org_vocab_end_index=48, padded_added_vocab_start_index=48,
    padded_added_vocab_end_index=48, org_vocab_start_index=0, org_vocab_end_index=40,
    added_vocab_start_index=48, added_vocab_end_index=48,
)
from types import SimpleNamespace
from ddtree.sglang.vocab_parallel import head_shard
rows = head_shard(padded)
padded.tp_size = 2  # rank 0 of 2: SGLang's head also carries its group and the whole vocabulary's size
no_group = head_shard(padded)
padded.tp_group, padded.org_vocab_size = SimpleNamespace(world_size=2, rank_in_group=0), 80
tp2 = head_shard(padded)
out["padded_head"] = {"rows": list(rows.weight.shape) if not isinstance(rows, str) else rows, "no_group": no_group,
                      "tp2": [list(tp2.weight.shape), tp2.start, tp2.vocab, tp2.rank, tp2.tp_size],
                      "quantized": head_shard(torch.nn.Identity())}
out["shadow_head"] = {"same_tokens": bool(torch.equal(tokens, expected)), "enabled": w._ddtree_enabled,
                      "nodes": obs.nodes if obs else None, "spine_matches": obs.spine_matches if obs else None}

# The version gate and the signature table on SGLang's real validator, plugin entry point and worker factory.
import ddtree.sglang.compat as compat, ddtree.sglang.plugin as plugin
out["installed_version"], out["drift"] = compat.installed_version(), compat.drift()
real_version = compat.installed_version
compat.installed_version = lambda: "0.5.99"
records = []
class Keep(logging.Handler):
    def emit(self, record): records.append((record.levelname, record.getMessage()))
logging.getLogger("ddtree").addHandler(Keep())
plugin.register()
out["other_version"] = {
    "register_log": records, "still_registered": plugin.is_registered(),
    "refused": gate({}), "allowed": gate({"env": {"DDTREE_ALLOW_SGLANG_VERSION": "0.5.22, 0.5.99"}}),
    "other_allowed": gate({"env": {"DDTREE_ALLOW_SGLANG_VERSION": "0.5.22"}}),
}
compat.installed_version = real_version
key = "sglang.srt.speculative.dflash_worker_v2:DFlashWorkerV2._draft_write_ids"
saved = compat.SIGNATURES[key]
compat.SIGNATURES[key] = ("self", "plan", "reader")
os.environ.clear(); os.environ.update(req["base_env"])
try:
    algo.create_worker(sa)
    out["tampered_create_worker"] = "ok"
except ValueError as e:
    out["tampered_create_worker"] = f"ValueError: {e}"
compat.SIGNATURES[key] = saved
class Bare(cls):
    def __init__(self):
        pass
out["bare_worker_attributes"] = compat.attribute_refusal(Bare())

capture_with_tree_masks(du, "triton")
out["graph_masks"] = {**graph_masks, "after": _captured()}
json.dump(out, sys.stdout)
"""

DRAFT_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
}

GATE_CASES: dict[str, dict[str, Any]] = {
    "good": {},
    "page_size": {"args": {"page_size": 16}},
    "overlap": {"args": {"disable_overlap_schedule": False}},
    "no_backend": {"args": {"attention_backend": None}},
    "fa3": {"args": {"attention_backend": "fa3"}},
    "rejection": {"args": {"speculative_use_rejection_sampling": True}},
    "tree": {"env": {"DDTREE_VERIFY": "tree"}},
    "bad_budget": {"env": {"DDTREE_BUDGET": "0"}},
    "no_eager_head": {"env": {"SGLANG_DFLASH_EAGER_DRAFT_SAMPLER": "0"}},
}


def sglang_probe(tmp: Path) -> Probe:
    """This module's part of the tier's one SGLang probe process (conftest.py, `sglang_probes`): _PROBE with its
    request (a draft model config for ServerArgs to read, the arguments, the gate cases) in a file under tmp."""
    draft = tmp / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps(DRAFT_CONFIG))
    good_args = {
        "model_path": str(draft),
        "speculative_algorithm": "DDTREE",
        "speculative_draft_model_path": str(draft),
        "speculative_num_draft_tokens": 8,
        "page_size": 1,
        "disable_overlap_schedule": True,
        "attention_backend": "triton",
        "device": "cuda",  # never touched: only read by DFLASH's resolution
    }
    argv = ["--model-path", str(draft), "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path"]
    argv += [str(draft), "--disable-overlap-schedule", "--page-size", "1", "--attention-backend", "triton"]
    request = {
        "signatures": list(SIGNATURES),
        "fields": FIELDS,
        "base_env": {k: v for k, v in os.environ.items() if not k.startswith("DDTREE_")} | SHADOW_ENV,
        "good_args": good_args,
        "gate_cases": GATE_CASES,
        "argv": argv,
    }
    (tmp / "request.json").write_text(json.dumps(request))
    return Probe(_PROBE, (str(tmp / "request.json"),))


@pytest.fixture(scope="module")
def probe(sglang_probes: dict[str, ProbeResult]) -> dict[str, Any]:
    done = sglang_probes[__name__]
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_plugin_is_discovered_through_entry_points_and_sglangs_loader(probe: dict[str, Any]) -> None:
    assert probe["group"] == "sglang.srt.plugins"
    assert ["ddtree", "ddtree.sglang.plugin:register", "ddtree-runtime"] in probe["entry_points"]
    assert probe["loaded"]["ddtree"] == ["ddtree.sglang.plugin:register", "ddtree-runtime"]


def test_ddtree_is_in_sglangs_registry_and_dispatches_like_dflash(probe: dict[str, Any]) -> None:
    algo = probe["algo"]
    assert algo["repr"] == "CustomSpecAlgo('DDTREE')" and algo["is_custom"] and algo["same"]
    assert algo["supports_overlap"] is False
    assert algo["answers"] == {
        "is_dflash": True,
        "is_dflash_family": True,
        "is_eagle": False,
        "is_speculative": True,
        "supports_target_verify_for_draft": True,
        "need_topk": False,
        "has_draft_kv": True,
    }
    assert algo["missing_enum_methods"] == [], "every SpeculativeAlgorithm method must exist on DDTREE"
    assert probe["resolution_hooks"] == {"handle_speculative_decoding": ["ddtree.sglang.plugin:_resolve_like_dflash"]}


def test_every_sglang_symbol_we_use_has_the_expected_signature(probe: dict[str, Any]) -> None:
    mismatched = {k: v for k, v in probe["signatures"].items() if v != list(SIGNATURES[k])}
    assert mismatched == {}
    assert probe["missing_fields"] == {path: [] for path in FIELDS}
    assert probe["eager_sampler_env"]


def test_gates_fire_on_real_server_args(probe: dict[str, Any]) -> None:
    gates = probe["gates"]
    assert gates["good"] == "ok"
    assert gates["tree"] == "ok"  # tree verify passes the start gates (its worker checks the model)
    expected = {
        "page_size": "DDTREE: --page-size must be 1 (got 16)",
        "overlap": "DDTREE: pass --disable-overlap-schedule",
        "no_backend": "DDTREE: pass --attention-backend triton",
        "fa3": "DDTREE: --attention-backend fa3 cannot take the tree mask",
        "rejection": "DDTREE: --speculative-use-rejection-sampling is not supported",
        "bad_budget": "DDTREE_BUDGET='0': expected an integer >= 1",
        "no_eager_head": "DDTREE: set SGLANG_DFLASH_EAGER_DRAFT_SAMPLER=1",
    }
    for case, text in expected.items():
        assert gates[case].startswith("ValueError: ") and text in gates[case], (case, gates[case])


def test_sglang_pipeline_resolves_ddtree_like_dflash_and_parses_the_flags(probe: dict[str, Any]) -> None:
    assert probe["resolved"] == {
        "speculative_algorithm": "DDTREE",
        "speculative_num_steps": 1,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 8,
        "max_running_requests": 48,
    }
    assert "DDTREE: --page-size must be 1 (got 4)" in probe["pipeline_bad_page_size"]
    assert probe["cli"] == {
        "speculative_algorithm": "DDTREE",
        "page_size": 1,
        "disable_overlap_schedule": True,
        "attention_backend": "triton",
    }
    assert probe["cli_gate"] == "ok"


def test_sglang_creates_the_shadow_and_tree_workers_on_dflash(probe: dict[str, Any]) -> None:
    assert probe["worker_mro"] == [
        "ddtree.sglang.shadow_worker:DDTreeShadowWorker",
        "sglang.srt.speculative.dflash_worker_v2:DFlashWorkerV2",
        "sglang.srt.speculative.base_spec_worker:BaseSpecWorker",
    ]
    assert "does not support overlap scheduling" in probe["overlap_create_worker"]
    assert probe["cached_config_worker"] == "DDTreeShadowWorker"  # the factory reads process_config(), once
    assert probe["tree_worker_mro"] == [
        "ddtree.sglang.tree_worker:DDTreeTreeWorker",
        "sglang.srt.speculative.dflash_worker_v2:DFlashWorkerV2",
        "sglang.srt.speculative.base_spec_worker:BaseSpecWorker",
    ]


def test_shadow_head_returns_dflash_tokens_and_builds_the_trees(probe: dict[str, Any]) -> None:
    assert probe["shadow_head"] == {"same_tokens": True, "enabled": True, "nodes": [9, 9], "spine_matches": True}
    # SGLang's head keeps statistics on, over the real vocabulary only (padding rows cut); at TP 2 over this
    # rank's shard, gathered through the head's group (ddtree.sglang.vocab_parallel)
    assert probe["padded_head"] == {
        "rows": [40, 16],
        "no_group": "the LM head is sharded over 2 ranks without a matching tensor-parallel group",
        "tp2": [[40, 16], 0, 80, 0, 2],
        "quantized": "the LM head is quantized (dense heads only)",
    }


def test_the_signature_table_was_checked_against_the_installed_sglang(probe: dict[str, Any]) -> None:
    assert probe["installed_version"] == compat.SGLANG_VERSION
    assert probe["drift"] == []
    # A table entry that no longer matches is refused when SGLang creates the worker, whatever the version.
    assert probe["tampered_create_worker"] == (
        f"ValueError: DDTREE: the installed SGLang {compat.SGLANG_VERSION} differs from the "
        f"{compat.SGLANG_VERSION} the plugin was checked against: "
        "sglang.srt.speculative.dflash_worker_v2:DFlashWorkerV2._draft_write_ids takes (self, plan), "
        f"expected (self, plan, reader); install sglang=={compat.SGLANG_VERSION}"
    )
    # the constructor's attribute check, on an instance DFlashWorkerV2's constructor never ran for
    assert probe["bare_worker_attributes"].startswith("DDTREE: SGLang's DFlashWorkerV2 has no block_size, ")


def test_another_sglang_version_is_refused_unless_the_variable_names_it(probe: dict[str, Any]) -> None:
    other = probe["other_version"]
    refusal = (
        "DDTREE: SGLang '0.5.99' is installed, but the plugin's signature table was checked against "
        f"{compat.SGLANG_VERSION} only; install sglang=={compat.SGLANG_VERSION}, or set "
        "DDTREE_ALLOW_SGLANG_VERSION=0.5.99 to run on it (the table is still checked when the worker starts)"
    )
    assert other["register_log"] == [["ERROR", refusal]]
    assert other["still_registered"]  # so the launcher reports the refusal, not an unknown algorithm
    assert other["refused"] == f"ValueError: {refusal}"
    assert other["other_allowed"] == f"ValueError: {refusal}"
    assert other["allowed"] == "ok"


def test_sglangs_real_policy_captures_triton_verify_graphs_with_the_mask_after_the_switch(
    probe: dict[str, Any],
) -> None:
    """ddtree.sglang.graph_masks against SGLang 0.5.23's real dflash_utils (folded into this probe: one SGLang
    import): SGLang captures DFLASH's verify graphs on triton without a mask; the switch changes that for triton
    only (flashinfer stays mask-free under graphs, so the worker refuses it)."""
    assert probe["graph_masks"] == {"before": [False, False], "after": [True, False]}
