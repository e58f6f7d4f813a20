"""The reference server's test faults: nothing without the marker file, a delay before each decode round's
tokens and flipped token ids when armed; unarmed the engine's stream is returned as it is."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from ddtree.serve import faults

pytestmark = pytest.mark.runtime


def engine(prompt: list[int], max_new_tokens: int = 3) -> Iterator[Sequence[int]]:
    yield [10]  # the prefill's token
    yield [11, 12]  # a decode round of two accepted tokens
    yield [13]


def test_an_environment_alone_arms_nothing(tmp_path: Path) -> None:
    env = {faults.DELAY_ENV: "500", faults.FLIP_ENV: "1"}
    assert faults.for_worker(engine, env, str(tmp_path / "absent")) is engine
    assert faults.for_worker(engine, {}, str(tmp_path)) is engine  # marker present, nothing asked for
    assert faults.from_env(env, armed=False) == faults.Faults()


def test_armed_faults_delay_decode_rounds_and_flip_tokens(tmp_path: Path) -> None:
    marker = tmp_path / "armed"
    marker.touch()
    slept: list[float] = []
    delayed = faults.wrap(engine, faults.from_env({faults.DELAY_ENV: "250"}, armed=True), slept.append)
    assert [list(c) for c in delayed([1])] == [[10], [11, 12], [13]] and slept == [0.25, 0.25]
    flipped = faults.for_worker(engine, {faults.FLIP_ENV: "1"}, str(marker))
    assert [list(c) for c in flipped([1])] == [[11], [10, 13], [12]]
    assert faults.from_env({faults.DELAY_ENV: "soon"}, armed=True) == faults.Faults()  # malformed: no delay
    assert faults.from_env({faults.DELAY_ENV: "1e9"}, armed=True).delay_s == 60.0
