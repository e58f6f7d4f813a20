import pytest

from opsctl.deploy.outcome import Outcome
from opsctl.rollout.plan import Target, count_failures, group_by_host, plan_batches, should_continue


def test_all_at_once_by_default():
    assert plan_batches([1, 2, 3, 4], canary=False, batch=None) == [[1, 2, 3, 4]]


def test_canary_then_batches():
    assert plan_batches([1, 2, 3, 4, 5, 6], canary=True, batch=2) == [[1], [2, 3], [4, 5], [6]]
    assert plan_batches([1, 2, 3], canary=True, batch=None) == [[1], [2, 3]]
    assert plan_batches([1], canary=True, batch=None) == [[1]]
    assert plan_batches([], canary=True, batch=3) == []


def test_batches_without_canary():
    assert plan_batches([1, 2, 3, 4, 5], canary=False, batch=2) == [[1, 2], [3, 4], [5]]
    with pytest.raises(ValueError):
        plan_batches([1], canary=False, batch=0)


def test_group_by_host_keeps_order():
    batch = [Target("a", "gpu0"), Target("b", "gpu0"), Target("a", "gpu1")]
    assert group_by_host(batch) == {"a": [Target("a", "gpu0"), Target("a", "gpu1")], "b": [Target("b", "gpu0")]}
    assert str(batch[0]) == "a/gpu0"


def test_max_fail():
    assert should_continue(0, 0)
    assert not should_continue(1, 0)
    assert should_continue(2, 2) and not should_continue(3, 2)


def test_failures_count_unreachable_and_rollbacks():
    outcomes = [Outcome.DEPLOYED, Outcome.UNCHANGED, Outcome.ROLLED_BACK, Outcome.UNREACHABLE, Outcome.LOCKED,
                Outcome.FAILED, Outcome.SKIPPED, Outcome.INTERRUPTED]  # fmt: skip
    assert count_failures(outcomes) == 4
