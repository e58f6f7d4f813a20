"""The reference server's test faults: nothing without the marker file; when armed, a delay inside each
decode round's target forward (not the prefill's) and flipped token ids; unarmed the engine's stream is
returned as it is."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from ddtree.serve import faults

pytestmark = pytest.mark.runtime


class Runner:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def prefill(self, ids: list[int]) -> None:
        self.calls.append("prefill")

    def decode(self, token: int) -> None:
        self.calls.append("decode")

    def verify(self, inputs: Any) -> None:
        self.calls.append("verify")


class Engine:
    """Prefill, one verify round of two accepted tokens, one decode round: the shape of ReferenceEngine.stream."""

    def __init__(self) -> None:
        self.runner = Runner()

    def stream(self, prompt: list[int], max_new_tokens: int = 3) -> Iterator[Sequence[int]]:
        self.runner.prefill(prompt)
        yield [10]
        self.runner.verify(None)
        yield [11, 12]
        self.runner.decode(12)
        yield [13]


def test_an_environment_alone_arms_nothing(tmp_path: Path) -> None:
    env = {faults.DELAY_ENV: "500", faults.FLIP_ENV: "1"}
    engine = Engine()
    assert faults.for_worker(engine, env, str(tmp_path / "absent")) == engine.stream
    assert faults.for_worker(engine, {}, str(tmp_path)) == engine.stream  # marker present, nothing asked for
    assert faults.from_env(env, armed=False) == faults.Faults()
    assert [list(c) for c in engine.stream([1])] == [[10], [11, 12], [13]]


def test_armed_faults_slow_decode_rounds_inside_and_flip_tokens(tmp_path: Path) -> None:
    marker = tmp_path / "armed"
    marker.touch()
    engine = Engine()
    faults.slow_rounds(engine.runner, 0.25, lambda s: engine.runner.calls.append(f"sleep {s}"))
    assert [list(c) for c in engine.stream([1])] == [[10], [11, 12], [13]]
    assert engine.runner.calls == ["prefill", "sleep 0.25", "verify", "sleep 0.25", "decode"]
    flipped = faults.for_worker(Engine(), {faults.FLIP_ENV: "1"}, str(marker))
    assert [list(c) for c in flipped([1])] == [[11], [10, 13], [12]]
    slowed = Engine()
    stream = faults.for_worker(slowed, {faults.DELAY_ENV: "1"}, str(marker))
    assert [list(c) for c in stream([1])] == [[10], [11, 12], [13]]  # the tokens are the engine's own
    assert slowed.runner.decode.__name__ == "slow" and slowed.runner.verify.__name__ == "slow"
    assert faults.from_env({faults.DELAY_ENV: "soon"}, armed=True) == faults.Faults()  # malformed: no delay
    assert faults.from_env({faults.DELAY_ENV: "1e9"}, armed=True).delay_s == 60.0
