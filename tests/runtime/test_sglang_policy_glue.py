"""ddtree.sglang.policy_glue: the per-round call the SGLang tree worker makes. Its device-side counterfactuals
equal the host reference's on SGLang-layout batches, lagged and split reports reach the policy, off and pinned
settings hold, and two TP ranks fed the same reports choose the same shapes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ddtree.config import DDTreeConfig
from ddtree.policy import CHAIN, PolicySetting, Shape, counterfactual_accepts
from ddtree.sglang.batch_round import commit_batch, plan_batch
from ddtree.sglang.devcheck import random_path_verify
from ddtree.sglang.policy_glue import PolicyGlue, RoundLedger, RoundRecorder, RoundReport, round_accepts
from ddtree.sglang.tree_round import commit_round, plan_round
from test_batch_tree import KINDS
from test_sglang_batch_round import random_round

pytestmark = pytest.mark.runtime


@pytest.mark.parametrize(("block", "slots", "budget", "topk"), [(8, 8, 7, 3), (8, 16, 15, 4), (6, 6, 5, 1)])
def test_round_accepts_equal_the_host_counterfactuals(block: int, slots: int, budget: int, topk: int) -> None:
    budgets = [b for b in (budget // 2, budget // 4) if b >= 1]
    shapes = [Shape(budget), *(Shape(b) for b in budgets), CHAIN]
    seen_shorter = 0
    for seed in range(20):
        bs = 1 + seed % 4
        lp, roots, prefixes = random_round(seed, bs, block, 40, [KINDS[seed % len(KINDS)]])
        ref = plan_round(lp, roots.tolist(), prefixes.tolist(), slots, budget, topk)
        plan = plan_batch(lp, roots, prefixes, slots, budget, topk)
        index, num, predict = random_path_verify(ref, 40, seed=100 + seed)
        want = commit_round(ref, index, num, predict)
        got = round_accepts(plan, commit_batch(plan, index, num, predict), budgets, block - 1).tolist()
        for b in range(bs):
            nodes = ref.layouts[b].order[want.paths[b]].tolist()
            host = counterfactual_accepts(ref.trees[b].parents.tolist(), nodes, Shape(budget), shapes, block - 1)
            assert got[b] == [host[Shape(budget)], host[CHAIN], *(host[Shape(x)] for x in budgets)], (seed, b)
            seen_shorter += host[CHAIN] < host[Shape(budget)]
    if topk > 1:
        assert seen_shorter >= 3  # the tree beat the chain somewhere: the comparison is not hollow


def _cfg(policy: str) -> DDTreeConfig:
    return DDTreeConfig(budget=16, topk=4, policy=PolicySetting.parse(policy))


def _drive(glue: PolicyGlue, rounds: int, bs: int, lag: int = 3) -> list[Shape]:
    """Synthetic worker: the chain is cheap (1 ms), trees dear (20 ms), trees accept more; reports `lag` rounds
    late, acceptance and cost in separate reports."""
    shapes: list[Shape] = []
    queue: list[list[RoundReport]] = []
    for _ in range(rounds):
        due = queue.pop(0) if len(queue) >= lag else []
        s = glue.next_shape(bs, due)
        shapes.append(s.shape)
        tree = 3 * bs if s.is_chain else 5 * bs
        queue.append(
            [
                RoundReport(s.round_id, bs, tree_accepted=tree, spine_accepted=3 * bs, smaller={8: 4 * bs, 4: 4 * bs}),
                RoundReport(s.round_id, bs, cost_ms=1.0 if s.is_chain else 20.0),
            ]
        )
    return shapes


def test_the_glue_moves_to_the_chain_when_it_pays_and_ranks_agree() -> None:
    rank0, rank1 = PolicyGlue(_cfg("auto"), seed=7), PolicyGlue(_cfg("auto"), seed=7)
    a, b = _drive(rank0, 700, bs=16), _drive(rank1, 700, bs=16)
    assert a == b
    # stable_config: no switch before 512 acceptance samples, then the chain (20x cheaper) at once
    first = a.index(CHAIN, 100) if CHAIN in a[100:] else -1
    assert a[0] == Shape(16) and a[:500].count(CHAIN) < 50 and a[-50:].count(CHAIN) >= 45, first
    assert "choice=9-16:chain" in rank0.log_fields()


def test_off_and_pinned() -> None:
    off = PolicyGlue(_cfg("off"))
    assert set(_drive(off, 50, bs=4)) == {Shape(16)} and off.next_shape(4).round_id == -1
    assert set(_drive(PolicyGlue(_cfg("tree5")), 50, bs=4)) == {Shape(5)}
    assert set(_drive(PolicyGlue(_cfg("chain")), 50, bs=4)) == {CHAIN}
    # whether DFLASH's chain rounds run (they read its greedy head: the tree worker's folded-head warning)
    runs = {p: PolicyGlue(_cfg(p)).runs_chain_rounds for p in ("off", "tree5", "chain", "auto")}
    assert runs == {"off": False, "tree5": False, "chain": True, "auto": True}


def test_unknown_and_bad_reports_are_ignored() -> None:
    glue = PolicyGlue(_cfg("auto"))
    glue.next_shape(2, [RoundReport(99, 2, tree_accepted=4), RoundReport(0, 0, cost_ms=1.0)])
    assert glue.policy.estimate(2, Shape(16)) is None


def _accepts(bs: int, committed: int, chain: int, *smaller: int) -> torch.Tensor:
    return torch.tensor([[committed, chain, *smaller]] * bs, dtype=torch.int64)


class FakeClock:
    """The ledger's host clock: each round takes `ms[i]` milliseconds."""

    def __init__(self, ms: list[float]) -> None:
        self.ms, self.now, self.calls = ms, 0.0, 0

    def __call__(self) -> float:
        if self.calls % 2:  # an end: the round's time later
            self.now += self.ms[self.calls // 2] / 1e3
        self.calls += 1
        return self.now


def test_the_ledger_reports_each_round_lag_rounds_later_with_sums_and_reduced_costs() -> None:
    reduced: list[list[float]] = []

    def reduce_max(costs: torch.Tensor) -> torch.Tensor:
        reduced.append(costs.tolist())
        return costs * 2  # what the other rank would have made of it

    ledger = RoundLedger(torch.device("cpu"), lag=2, reduce_max=reduce_max, clock=FakeClock([3.0, 5.0, 7.0]))
    assert ledger.due() == []
    ledger.open()
    ledger.close(10, 3, _accepts(3, 4, 2, 3), budgets=(8,))
    assert ledger.due() == []  # one round back: not yet
    ledger.open()
    ledger.close(11, 2, _accepts(2, 2, 2))  # a chain round
    (first,) = ledger.due()
    assert first == RoundReport(10, 3, tree_accepted=12, spine_accepted=6, smaller={8: 9}, cost_ms=6.0, gap_ms=0.0)
    assert reduced == [[3.0, 0.0]] and ledger.due() == []  # costs, then gaps (round 11 opened as 10 ended)
    ledger.open()
    ledger.close(12, 1, _accepts(1, 5, 1, 4, 2), budgets=(8, 4))
    (second,) = ledger.due()
    assert (second.round_id, second.tree_accepted, second.spine_accepted, second.smaller) == (11, 4, 4, {})
    assert second.cost_ms == 10.0 and reduced[-1] == [5.0, 0.0] and second.gap_ms == 0.0
    with pytest.raises(ValueError, match=r"accepts must be \[bs, 3\]"):
        ledger.close(13, 1, _accepts(1, 5, 1), budgets=(8,))


class ScriptedClock:
    """The host clock of a CPU ledger: each call returns the next of `times` (seconds)."""

    def __init__(self, times: list[float]) -> None:
        self.times = iter(times)

    def __call__(self) -> float:
        return next(self.times)


def test_the_ledger_reports_the_gap_after_each_round_and_skips_other_forwards() -> None:
    # round 0: 1.000-1.002 s, round 1 starts 12 ms after it; a prefill, then round 2; round 3 5 ms after round 2
    clock = ScriptedClock([1.000, 1.002, 1.014, 1.015, 1.100, 1.101, 1.106, 1.108, 1.108, 1.109])
    ledger = RoundLedger(torch.device("cpu"), lag=2, clock=clock)
    reports = []
    for rid in range(4):
        if rid == 2:
            ledger.interrupt()  # the worker ran a prefill between rounds 1 and 2
        reports += ledger.due()
        ledger.open()
        ledger.close(rid, 2, _accepts(2, 3, 2))
    assert [r.round_id for r in reports] == [0, 1]  # lag 2: round 2 reports at round 4's call, round 3 after
    assert [None if r.gap_ms is None else round(r.gap_ms, 3) for r in reports] == [12.0, None]
    assert [round(r.cost_ms or 0, 3) for r in reports] == [2.0, 1.0]
    ledger.open()  # round 4, at once: round 3's gap is 0
    ledger.close(4, 2, _accepts(2, 3, 2))
    later = ledger.due()
    assert [(r.round_id, None if r.gap_ms is None else round(r.gap_ms, 3)) for r in later] == [(2, 5.0), (3, 0.0)]


def test_the_ledger_reuses_its_host_rows_without_mixing_rounds() -> None:
    ledger = RoundLedger(torch.device("cpu"), lag=3)
    got = []
    for rid in range(20):
        got += ledger.due()
        ledger.open()
        ledger.close(rid, 1, _accepts(1, rid + 1, 1))
    assert [r.round_id for r in got] == list(range(17))
    assert [r.tree_accepted for r in got] == [rid + 1 for rid in range(17)]


def _phased(rounds: int, bs: int, clock_ms: list[float], lag: int = 2) -> tuple[list[Shape], list[str]]:
    """The worker's loop on the phased test policy: glue + ledger, a tree commits more than the chain."""
    glue = PolicyGlue(DDTreeConfig(budget=7, topk=8, policy=PolicySetting.parse("auto")), test="phased")
    ledger = RoundLedger(torch.device("cpu"), lag=lag, clock=FakeClock(clock_ms))
    shapes, notes = [], []
    for _ in range(rounds):
        s = glue.next_shape(bs, ledger.due())
        notes.append(glue.switch_note(bs))
        shapes.append(s.shape)
        ledger.open()
        smaller = glue.smaller(s.shape)
        committed = 2 if s.is_chain else 4
        ledger.close(s.round_id, bs, _accepts(bs, committed, 2, *(3 for _ in smaller)), smaller)
    return shapes, [n for n in notes if n]


def test_the_phased_test_policy_leaves_the_tree_for_the_chain_and_comes_back() -> None:
    shapes, notes = _phased(12, bs=2, clock_ms=[1.0] * 12)
    assert shapes[0] == Shape(7) and CHAIN in shapes and shapes[-1] != CHAIN
    assert notes[0].startswith("batch 2: tree7 -> chain (tok/ms tree7 ")
    assert any(n.startswith("batch 2: chain -> tree") for n in notes[1:]), notes
    # the real costs do not matter to it (synthetic), so ranks with different clocks agree
    assert _phased(12, bs=2, clock_ms=[9.0] * 12)[0] == shapes
    with pytest.raises(ValueError, match="DDTREE_TEST_POLICY='fast': expected phased"):
        PolicyGlue(_cfg("auto"), test="fast")


def test_the_glue_takes_its_test_hooks_from_the_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "rounds.jsonl"
    opened: list[str] = []  # the file a recorder would append to (kept open for the process's life)
    monkeypatch.setattr(RoundRecorder, "to_file", classmethod(lambda cls, name: opened.append(name) or cls(print)))
    env = {"DDTREE_POLICY": "auto", "DDTREE_TEST_POLICY": "phased", "DDTREE_RECORD_ROUNDS": str(path)}
    glue = PolicyGlue.from_config(DDTreeConfig.from_env(env))
    assert glue.phased and glue.recorder is not None and opened == [str(path)]
    plain = PolicyGlue.from_config(DDTreeConfig.from_env({"DDTREE_POLICY": "auto"}))
    assert not plain.phased and plain.recorder is None


def test_smaller_budgets_and_notes() -> None:
    glue = PolicyGlue(_cfg("auto"))
    assert glue.smaller(Shape(16)) == (8, 4) and glue.smaller(Shape(8)) == (4,) and glue.smaller(CHAIN) == ()
    assert glue.switch_note(4) == ""  # before the bucket's first round
    glue.next_shape(4)
    assert glue.switch_note(4) == ""  # still the configured tree
    pinned = PolicyGlue(_cfg("chain"))
    pinned.next_shape(40)
    assert pinned.switch_note(40) == ""  # pinned from the start: no change to report


HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_real_ranks_with_different_timings_choose_the_same_shapes(tmp_path: Path) -> None:
    """The worker's TP path: gloo, two processes, each with its own round-time noise. With `cost_max` (the MAX
    over the ranks) every decision agrees; without it (the control) the same loop diverges."""
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": f"{HERE.parent.parent / 'runtime'}:{HERE}", "OMP_NUM_THREADS": "1"}
    worker = [sys.executable, str(HERE / "tp_gloo_policy_worker.py"), str(tmp_path)]
    procs = [
        subprocess.Popen(
            [*worker, str(r), "2", port], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for r in range(2)
    ]
    for p in procs:
        output, _ = p.communicate(timeout=240)
        assert p.returncode == 0, output[-3000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert rank0["max"] == rank1["max"]
    assert len(set(rank0["max"])) >= 2  # it did choose: not one shape throughout
    assert rank0["own"] != rank1["own"]
