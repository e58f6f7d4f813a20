"""The reference server's loading phase pauses Python's cyclic collector (ddtree.serve.state.collector_paused):
paused inside, running again after, and what loaded frozen out of later collections only when loading worked."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from ddtree.serve.state import collector_paused

pytestmark = pytest.mark.runtime


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    yield
    gc.unfreeze()  # what a test froze goes back to the collector's generations
    gc.enable()


def test_paused_while_loading_then_running_with_the_loaded_objects_frozen() -> None:
    gc.unfreeze()
    with collector_paused():
        assert not gc.isenabled()
        loaded = [[i] for i in range(1000)]  # stands for the model and the modules' objects
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(loaded)


def test_a_failed_load_freezes_nothing_and_turns_the_collector_back_on() -> None:
    gc.unfreeze()
    with pytest.raises(OSError), collector_paused():
        raise OSError("weights missing")
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()
