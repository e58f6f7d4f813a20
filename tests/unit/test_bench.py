"""opsctl bench's pure parts: stream parsing, aggregation, ratios, bias warnings, JSON agreeing with samples."""

from __future__ import annotations

import json
import statistics

import pytest

from opsctl.bench.measure import Sample, parse_stream
from opsctl.bench.prompts import load_prompts
from opsctl.bench.report import Arm, parse_prometheus, summarize
from opsctl.bench.run import BenchSettings
from opsctl.bench.sweep import parse_sweep, with_knob
from opsctl.cli.bench import report_json
from opsctl.errors import OpsctlError


def _arm(label: str, mode: str, tok_walls: list[tuple[int, float]], tau: float | None, **settings: object) -> Arm:
    samples = tuple(Sample(f"p{i}", 0, t, w, w / 4, "length") for i, (t, w) in enumerate(tok_walls))
    return Arm(label, "h", label, mode, "reference", settings, samples, tau)


def test_parse_stream_finds_first_text_usage_and_finish() -> None:
    lines = [
        (0.10, 'data: {"choices":[{"delta":{"role":"assistant"}}]}'),
        (0.25, 'data: {"choices":[{"delta":{"reasoning_content":"Hm"}}]}'),
        (0.30, 'data: {"choices":[{"delta":{"content":"4"},"finish_reason":"stop"}]}'),
        (0.31, 'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16}}'),
        (0.32, "data: [DONE]"),
    ]
    assert parse_stream(lines) == (0.25, 7, "stop")


def test_summary_medians_and_ratio_come_from_the_samples() -> None:
    base = _arm("base", "baseline", [(100, 2.0), (100, 1.0), (50, 1.0)], 1.0)
    tree = _arm("tree", "tree", [(100, 0.5), (120, 1.0), (90, 1.0)], 2.4)
    report = summarize([base, tree])
    b, t = report.summaries
    assert b.tok_s.median == statistics.median([50.0, 100.0, 50.0]) == 50.0
    assert (t.tok_s.min, t.tok_s.median, t.tok_s.max) == (90.0, 120.0, 200.0)
    assert t.ratio == pytest.approx(120.0 / 50.0)
    assert t.completion_tokens == 310 and t.requests == 3
    assert report.warnings == ()


def test_bias_warnings_name_the_differing_setting() -> None:
    a = _arm("a", "linear", [(10, 1.0)], 2.0, disable_cuda_graph=False)
    b = _arm("b", "tree", [(10, 1.0)], 2.0, disable_cuda_graph=True)
    (warning,) = summarize([a, b]).warnings
    assert warning == "arms differ in disable_cuda_graph: a=False, b=True"


def test_json_numbers_agree_with_token_counts() -> None:
    report = summarize([_arm("a", "baseline", [(64, 2.0), (32, 0.5)], 1.0)])
    data = json.loads(json.dumps(report_json(report, BenchSettings(repeat=1, max_tokens=64))))
    arm = data["arms"][0]
    for sample in arm["samples"]:
        assert sample["tok_s"] == pytest.approx(sample["completion_tokens"] / sample["wall_s"])
    assert arm["summary"]["completion_tokens"] == sum(s["completion_tokens"] for s in arm["samples"])
    assert arm["summary"]["tok_s"]["median"] == pytest.approx(statistics.median(s["tok_s"] for s in arm["samples"]))
    assert data["settings"]["temperature"] == 0 and data["settings"]["thinking"] is False


def test_prometheus_parser_reads_sglang_gauges() -> None:
    text = (
        "# HELP sglang:spec_accept_length The average acceptance length\n"
        "# TYPE sglang:spec_accept_length gauge\n"
        'sglang:spec_accept_length{model_name="m"} 2.75\n'
        'sglang:gen_throughput{model_name="m"} 41.5\n'
    )
    assert parse_prometheus(text) == {"sglang:spec_accept_length": 2.75, "sglang:gen_throughput": 41.5}


def test_sweep_parsing_and_variants() -> None:
    assert parse_sweep("budget=15,32,64") == ("budget", (15, 32, 64))
    for bad in ("budget", "depth=3", "budget=0", "topk=a"):
        with pytest.raises(OpsctlError):
            parse_sweep(bad)
    from opsctl.inventory.load import load_inventory
    from tests.conftest import REPO

    svc = load_inventory(REPO / "inventory/ct200.yaml").hosts[0].service("gpu1")
    assert with_knob(svc, "budget", 64).ddtree.budget == 64 and svc.ddtree.budget == 15


def test_default_prompts_cover_the_workload_classes() -> None:
    categories = {p.category for p in load_prompts()}
    assert categories == {"short chat", "code", "math", "JSON extraction", "long-form"}


def test_table_is_not_squeezed_in_a_pipe(capsys: pytest.CaptureFixture[str]) -> None:
    from opsctl.cli.bench import _print_table

    base = _arm("lab1/base-service", "baseline", [(16, 0.1)], 1.0)
    tree = _arm("lab1/tree-service", "tree", [(16, 0.05)], 3.0)
    _print_table(summarize([base, tree]))
    err = capsys.readouterr().err
    for text in ("tok/s med", "tok/s min-max", "vs first", "lab1/base-service", "lab1/tree-service", "2.00x"):
        assert text in err


def test_one_prompt_file_serves_smoke_and_bench(tmp_path) -> None:
    """The lab's prompt file has smoke's max_tokens; bench reads the same file (a typo'd key is still refused)."""
    from pathlib import Path

    from opsctl import smoke

    lab = Path(__file__).resolve().parents[2] / "inventory" / "lab-prompts.yaml"
    assert [p.id for p in load_prompts(lab)] == [p.id for p in smoke.load_prompts(lab)]
    typo = tmp_path / "p.yaml"
    typo.write_text("prompts: [{prompt: x, max_token: 8}]")
    with pytest.raises(OpsctlError, match="unknown keys"):
        load_prompts(typo)


def test_concurrency_levels_are_validated_whole() -> None:
    from opsctl.bench.load import parse_levels

    assert parse_levels("1,4, 8,16,32") == (1, 4, 8, 16, 32)
    for bad in ("", "0,4", "4,4", "1,x", "257"):
        with pytest.raises(OpsctlError, match="--concurrency"):
            parse_levels(bad)


def test_verify_rounds_come_from_sglangs_spec_details() -> None:
    from opsctl.bench.measure import verify_rounds

    details = '{"spec_accept_length":3.2,"spec_verify_ct":20}'
    lines = [
        (0.1, 'data: {"choices":[{"delta":{"content":"x"}}]}'),
        (0.2, 'data: {"choices":[],"sglext":{"spec_tokens_details":' + details + "}}"),
        (0.3, "data: [DONE]"),
    ]
    assert verify_rounds(lines) == 20
    assert verify_rounds(lines[:1]) is None


def test_a_level_keeps_n_requests_in_flight_and_sums_them() -> None:
    import threading

    from opsctl.bench.load import run_level
    from opsctl.bench.prompts import BenchPrompt

    prompts = [BenchPrompt(f"p{i}", "user", f"prompt {i}") for i in range(3)]
    lock, in_flight, peak, calls = threading.Lock(), [0], [0], [0]
    gate = threading.Barrier(4, timeout=10)  # four requests must be in flight at once, or this times out

    def send(prompt: BenchPrompt, rep: int) -> tuple[Sample, int | None]:
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
            calls[0] += 1
            first_four = calls[0] <= 4
        if first_four:
            gate.wait()  # the first four requests meet here
        with lock:
            in_flight[0] -= 1
        return Sample(prompt.id, rep, 11, 2.0, 0.5, "length"), 4

    result = run_level(send, prompts, concurrency=4, requests=8)
    assert peak[0] == 4 and len(result.samples) == 8
    assert result.completion_tokens == 88 and result.verify_rounds == 32 and result.tau == pytest.approx(88 / 32)
    assert result.itl_s == pytest.approx((2.0 - 0.5) / 10) and result.tok_s_request == pytest.approx(5.5)
