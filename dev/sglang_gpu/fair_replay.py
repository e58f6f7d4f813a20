"""The fair replay's bookkeeping (dev/sglang_gpu/cost_bench.py `--fair`): both modes replay a real pair's recorded
acceptance at a real shape, every batch size the same recorded requests, and the report sets what the recording
says beside what the replay did, with a bootstrap interval over requests for the tree / DFLASH ratio.

- Which requests (`level_requests`): at batch size bs, max(recorded, `minimum`) requests rounded up to whole
  batches, taking recorded requests 0, 1, ... cyclically; every recorded request runs at least once at every
  batch size. Statistics average a recorded request's occurrences first (`per_request`), so each recorded
  request weighs the same at every batch size.
- The recording's tau (`expected_accept_length`): what SGLang will report for a replayed request of `new_tokens`
  tokens if the replay commits exactly the recording (`meta_info["spec_accept_length"]` = completion tokens /
  verify rounds; the first token comes from the prefill, and the last round is cut at `new_tokens`): the rounds
  it draws are its recording's first ones, again from the start when they run out. A tree's recorded path can
  be cut where this round's tree is shallower (ddtree.sglang.replay); DFLASH's lengths are replayed exactly.
- Per request tok/s (`request_tok_s`): the decode tokens after the prefill's over its verify rounds times the
  batch's median step (the host interval between round starts, the replay's own host time taken out where
  `replay_ms` is given: the replay is a benchmark's cost, not the mode's).
- The ratio (`bootstrap_ratio`): mean tree tok/s over mean DFLASH tok/s over the recorded requests both ran;
  the interval resamples recorded requests with replacement (percentiles of `draws` resamples, fixed seed).

Pure functions: tests/runtime/test_fair_replay.py.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def level_requests(bs: int, recorded: int, minimum: int = 16) -> list[list[int]]:
    """The recorded request of each replayed request at batch size `bs`, batch by batch."""
    if bs < 1 or recorded < 1:
        raise ValueError(f"batch size {bs} and recorded requests {recorded} must be >= 1")
    total = max(recorded, minimum)
    total += -total % bs  # whole batches
    order = [i % recorded for i in range(total)]
    return [order[i : i + bs] for i in range(0, total, bs)]


def rounds_for(lengths: Sequence[int], new_tokens: int, cap: int) -> list[int]:
    """The recorded rounds (accepted drafted tokens, at most `cap`) a replayed request of `new_tokens` tokens
    goes through: rounds commit length + 1 tokens each until new_tokens - 1 follow the prefill's token."""
    if not lengths:
        raise ValueError("a recorded request without rounds")
    out: list[int] = []
    done = 1
    while done < new_tokens:
        n = min(lengths[len(out) % len(lengths)], cap)
        out.append(n)
        done += n + 1
    return out


def expected_accept_length(lengths: Sequence[int], new_tokens: int, cap: int) -> float:
    """SGLang's spec_accept_length for a request that commits exactly its recording (module docstring)."""
    return new_tokens / max(len(rounds_for(lengths, new_tokens, cap)), 1)


def recording_tau(requests: Sequence[Sequence[int]], cap: int) -> float:
    """The recording's own tau: committed tokens per round over all its rounds (length + 1, capped)."""
    rounds = [min(n, cap) + 1 for rounds in requests for n in rounds]
    return sum(rounds) / len(rounds)


def request_tok_s(out_len: int, verify_ct: int, step_ms: float, replay_ms: float = 0.0) -> float:
    """Decode tokens per second of one request: its tokens after the prefill's over its rounds x the step."""
    seconds = verify_ct * max(step_ms - replay_ms, 1e-9) / 1e3
    return (out_len - 1) / seconds if verify_ct > 0 else 0.0


def per_request(indices: Sequence[int], values: Sequence[float]) -> dict[int, float]:
    """Mean value per recorded request (its occurrences at one batch size)."""
    groups: dict[int, list[float]] = {}
    for i, v in zip(indices, values, strict=True):
        groups.setdefault(i, []).append(v)
    return {i: statistics.fmean(vs) for i, vs in groups.items()}


def bootstrap_ratio(
    tree: Mapping[int, float], dflash: Mapping[int, float], draws: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """(ratio, low, high): mean tree / mean DFLASH over the recorded requests both have, and the percentile
    interval of that ratio over `draws` resamples of those requests with replacement."""
    common = sorted(set(tree) & set(dflash))
    if not common:
        raise ValueError("no recorded request ran in both modes")
    ratio = statistics.fmean(tree[i] for i in common) / statistics.fmean(dflash[i] for i in common)
    rng = random.Random(seed)
    samples = []
    for _ in range(draws):
        pick = [common[rng.randrange(len(common))] for _ in common]
        samples.append(sum(tree[i] for i in pick) / sum(dflash[i] for i in pick))
    samples.sort()
    tail = (1 - level) / 2
    low = samples[int(tail * (draws - 1))]
    high = samples[int((1 - tail) * (draws - 1) + 0.5)]
    return ratio, low, high


@dataclass(frozen=True)
class ModeLevel:
    """One mode at one batch size: per replayed request its recorded index, output length, verify rounds and
    SGLang's accept length; the level's median step and the replay's median host time per round (ms)."""

    indices: list[int]
    out_lens: list[int]
    verify_cts: list[int]
    accept: list[float]
    step_ms: float
    replay_ms: float

    def tok_s(self) -> dict[int, float]:
        rates = [
            request_tok_s(n, v, self.step_ms, self.replay_ms)
            for n, v in zip(self.out_lens, self.verify_cts, strict=True)
        ]
        return per_request(self.indices, rates)

    def tau(self) -> float:
        return statistics.fmean(per_request(self.indices, self.accept).values())


def expected_tau(indices: Sequence[int], requests: Sequence[Sequence[int]], new_tokens: int, cap: int) -> float:
    """The recording's accept length over the recorded requests a level replayed (each weighing the same)."""
    return statistics.fmean(expected_accept_length(requests[i], new_tokens, cap) for i in sorted(set(indices)))


def report_row(
    bs: int, dflash: ModeLevel, tree: ModeLevel, recorded: tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]],
    new_tokens: int, caps: tuple[int, int],
) -> list[str]:  # fmt: skip
    """One table row: bs, requests; per mode the recording's tau and the replayed one, the step, the replay's
    host ms; tok/s per request of each mode (the replay's host time out); the ratio and its interval."""
    d_rec = expected_tau(dflash.indices, recorded[0], new_tokens, caps[0])
    t_rec = expected_tau(tree.indices, recorded[1], new_tokens, caps[1])
    d_rate, t_rate = dflash.tok_s(), tree.tok_s()
    ratio, low, high = bootstrap_ratio(t_rate, d_rate)
    return [
        str(bs), str(len(set(tree.indices) & set(dflash.indices))),
        f"{d_rec:.2f} / {dflash.tau():.2f}", f"{t_rec:.2f} / {tree.tau():.2f}",
        f"{dflash.step_ms:.2f}", f"{tree.step_ms:.2f}", f"{dflash.replay_ms:.2f} / {tree.replay_ms:.2f}",
        f"{statistics.fmean(d_rate.values()):.1f}", f"{statistics.fmean(t_rate.values()):.1f}",
        f"{ratio:.3f} [{low:.3f}, {high:.3f}]",
    ]  # fmt: skip


HEADER = (
    "| bs | requests | DFLASH tau recorded / replayed | tree tau recorded / replayed | DFLASH step ms | tree step ms "
    "| replay host ms DFLASH / tree | DFLASH tok/s per request | tree tok/s per request | tree / DFLASH [95% CI] |"
)
RULE = "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"


def table(rows: list[list[str]]) -> str:
    return "\n".join([HEADER, RULE, *("| " + " | ".join(row) + " |" for row in rows)])
