"""The GPU harness's measurement patches (dev/sglang_gpu/standin): round_timer keeps the signature of the worker
constructor it wraps (the plugin's start-up check reads it), and loop_timer's scheduler-loop phases, on stand-in
classes (no SGLang, no CUDA). Each module is loaded from its file under another name."""

from __future__ import annotations

import importlib.util
import inspect
import json
import pstats
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.runtime

STANDIN = Path(__file__).resolve().parents[2] / "dev" / "sglang_gpu" / "standin"


def _load(name: str) -> ModuleType:
    full = f"ddtree_gpu_standin_{name}"
    if full in sys.modules:
        return sys.modules[full]
    spec = importlib.util.spec_from_file_location(full, STANDIN / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)
    return module


def test_round_timer_keeps_the_worker_constructor_signature() -> None:
    class DFlashWorkerV2:
        def __init__(self, server_args: Any, gpu_id: int, nccl_port: int, target_worker: Any) -> None:
            self.made = (server_args, gpu_id, nccl_port, target_worker)

    before = tuple(inspect.signature(DFlashWorkerV2.__init__).parameters)
    _load("round_timer").patch_worker_class(SimpleNamespace(DFlashWorkerV2=DFlashWorkerV2))
    assert tuple(inspect.signature(DFlashWorkerV2.__init__).parameters) == before


class _Mode:
    def __init__(self, extend: bool) -> None:
        self.extend = extend

    def is_extend(self) -> bool:
        return self.extend

    def is_idle(self) -> bool:
        return False


class _Worker:
    def forward_batch_generation(self, batch: Any) -> str:
        time.sleep(0.02)  # the round
        return "result"


class _Scheduler:
    """The four methods event_loop_normal calls, in its order."""

    def __init__(self) -> None:
        self.model_worker = _Worker()

    def ingest_requests(self) -> None:
        pass

    def get_next_batch_to_run(self, extend: bool) -> Any:
        return SimpleNamespace(forward_mode=_Mode(extend), is_extend_in_batch=False, reqs=[1, 2, 3])

    def run_batch(self, batch: Any) -> str:
        return str(self.model_worker.forward_batch_generation(batch))

    def process_batch_result(self, batch: Any, result: str) -> None:
        sum(range(1000))  # profiled, outside the round

    def loop_once(self, extend: bool) -> None:
        self.ingest_requests()
        batch = self.get_next_batch_to_run(extend)
        self.process_batch_result(batch, self.run_batch(batch))


def test_loop_timer_writes_one_line_per_decode_iteration_and_profiles_outside_the_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines, prof = tmp_path / "loop.jsonl", tmp_path / "loop.prof"
    monkeypatch.setenv("DDTREE_LOOP_TIMER", str(lines))
    monkeypatch.setenv("DDTREE_LOOP_PROFILE", str(prof))
    _load("loop_timer").patch_scheduler(SimpleNamespace(Scheduler=_Scheduler))
    scheduler = _Scheduler()
    scheduler.loop_once(extend=True)  # a prefill: no line
    for _ in range(22):
        scheduler.loop_once(extend=False)
    scheduler.ingest_requests()  # the next iteration's start closes the last decode iteration's line

    records = [json.loads(x) for x in lines.read_text().splitlines()]
    assert len(records) == 22
    assert {r["mode"] for r in records} == {"_Worker"} and {r["bs"] for r in records} == {3}
    for r in records:
        assert r["round"] >= 20.0 and r["run"] < r["round"] / 2  # run_batch's own time, the round left out
        assert r["loop"] >= r["round"] + r["run"] + r["process"]
    profiled = {name for (_, _, name) in pstats.Stats(str(prof)).stats}  # type: ignore[attr-defined]
    assert "process_batch_result" in profiled and "forward_batch_generation" not in profiled
