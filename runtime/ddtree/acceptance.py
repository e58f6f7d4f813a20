"""What a tree round accepts, for every request kind: the logit rules SGLang's non-speculative decode applies
(frequency / presence / repetition penalties, min_new_tokens, logit_bias), applied at every tree node as if the
node's path had been decoded; and the walk that turns one target choice per node into the committed tokens,
batched (`walk_batch`; one tree at a time: `ddtree.tree.walk_visiting`).

Why this is exact. The baseline picks each token from the target's logits at that position, adjusted by rules
that read the request's output so far. A tree node at depth d stands for the output "committed tokens + the d
tokens on its path"; its row of the verify logits is the target's row for that context. So node i's adjusted
row is the baseline's adjusted row at that position when its path is what was decoded: penalties count the
committed output AND the path's tokens, min_new_tokens counts the committed length plus the depth. One choice
per node (argmax, or a draw from the adjusted, filtered distribution), then the walk: from the root, follow the
child whose token is the choice, and the first choice with no such child is the bonus. Every committed token is
then the target's own choice given its accepted prefix: greedy rows get the baseline's argmax, sampled rows the
baseline's law (each visited node is drawn independently), and seeded rows, drawn with the baseline's own
noise keyed by (seed, position), the baseline's tokens.

SGLang's order: the penalties (frequency, presence, min_new_tokens' -inf on stop tokens, the multiplicative
repetition penalty; in the order `PENALTIES` documents), then the grammar mask, then logit_bias; the sampler then
applies temperature, top-k, top-p and min-p. SGLang counts output tokens only (not the prompt) for all three
penalties.

A decode loop keeps a request's output as running state (`RunningRules`: counts updated by each commit, never
recounted). Pure tensor code: the SGLang worker and the reference engine both call it; tests/runtime/test_acceptance.py
checks it against a per-node reference and a distribution oracle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class RequestRules:
    """One request's logit rules, as SGLang's SamplingParams carries them."""

    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    stop_token_ids: frozenset[int] = frozenset()  # suppressed while the output is shorter than min_new_tokens
    logit_bias: Mapping[int, float] = field(default_factory=dict)

    @property
    def reads_output(self) -> bool:
        """True when the rules depend on the output so far (penalties, min_new_tokens)."""
        return (
            self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.repetition_penalty != 1.0
            or self.min_new_tokens > 0
        )

    @property
    def active(self) -> bool:
        return self.reads_output or bool(self.logit_bias)


@dataclass(frozen=True)
class BatchRules:
    """A batch's rules on the device. bs requests, V vocabulary entries."""

    frequency: Tensor  # [bs] float32
    presence: Tensor  # [bs] float32
    repetition: Tensor  # [bs] float32 (1: off)
    counts: Tensor  # [bs, V] float32: how often each token is in the committed output
    output_lens: Tensor  # [bs] int64: committed output tokens
    min_new_tokens: Tensor  # [bs] int64
    stop_penalty: Tensor  # [bs, V] float32: -inf at the request's stop tokens, 0 elsewhere
    logit_bias: Tensor | None  # [bs, V] float32, None when no request has one


def batch_rules(
    rules: Sequence[RequestRules],
    outputs: Sequence[Sequence[int]],
    vocab: int,
    device: torch.device,
    force: bool = False,
    counts: Tensor | None = None,
) -> BatchRules | None:
    """The device form of `rules`, with each request's committed output (`outputs`); None when no rule applies
    (unless `force`: the caller adds a rule of its own, such as a logit_bias tensor it already holds). `counts`:
    the outputs' token counts [bs, V] on the device, kept by the caller (`ddtree.sglang.penalty_counts`); the
    outputs then give their lengths only."""
    if len(rules) != len(outputs):
        raise ValueError(f"{len(rules)} rule sets for {len(outputs)} outputs")
    if not force and not any(r.active for r in rules):
        return None
    bs = len(rules)
    if counts is not None and tuple(counts.shape) != (bs, vocab):
        raise ValueError(f"counts of shape {tuple(counts.shape)} for {bs} requests of {vocab} tokens")
    # the [bs, V] tensors start on the device: only their few set entries cross from the host
    stop = torch.zeros((bs, vocab), dtype=torch.float32, device=device)
    stop_at = [(b, t) for b, r in enumerate(rules) if r.min_new_tokens > 0 for t in r.stop_token_ids if 0 <= t < vocab]
    _put(stop, stop_at, [float("-inf")] * len(stop_at))
    bias = None
    if any(r.logit_bias for r in rules):
        bias = torch.zeros((bs, vocab), dtype=torch.float32, device=device)
        bias_at = [(b, t, float(v)) for b, r in enumerate(rules) for t, v in r.logit_bias.items() if 0 <= t < vocab]
        _put(bias, [(b, t) for b, t, _ in bias_at], [v for _, _, v in bias_at])

    def column(values: list[float], dtype: torch.dtype = torch.float32) -> Tensor:
        return torch.tensor(values, dtype=dtype).to(device)

    return BatchRules(
        frequency=column([r.frequency_penalty for r in rules]),
        presence=column([r.presence_penalty for r in rules]),
        repetition=column([r.repetition_penalty for r in rules]),
        counts=output_counts(rules, outputs, vocab).to(device) if counts is None else counts,
        output_lens=column([len(o) for o in outputs], torch.int64),
        min_new_tokens=column([r.min_new_tokens for r in rules], torch.int64),
        stop_penalty=stop,
        logit_bias=bias,
    )


def _put(table: Tensor, at: Sequence[tuple[int, int]], values: Sequence[float]) -> None:
    """table[row, column] = value for each of `at` (distinct entries), in one copy to the table's device."""
    if not at:
        return
    index = torch.tensor(at, dtype=torch.int64).to(table.device)  # [n, 2]
    table[index[:, 0], index[:, 1]] = torch.tensor(values, dtype=table.dtype).to(table.device)


def output_counts(rules: Sequence[RequestRules], outputs: Sequence[Sequence[int]], vocab: int) -> Tensor:
    """[bs, V] float32 on the host: how often each token is in each output whose rules read it (0 elsewhere)."""
    counts = torch.zeros((len(rules), vocab), dtype=torch.float32)
    for b, (rule, out) in enumerate(zip(rules, outputs, strict=True)):
        if rule.reads_output and out:
            ids = torch.tensor([t for t in out if 0 <= t < vocab], dtype=torch.int64)
            counts[b].scatter_add_(0, ids, torch.ones(ids.shape, dtype=torch.float32))
    return counts


def path_counts(base: Tensor, tokens: Tensor, tree_mask: Tensor, depths: Tensor) -> Tensor:
    """[bs, S, V]: base [bs, V] plus, for node i, one count for every node on its path below the root (its
    ancestors at depth >= 1 and itself). tokens, depths: [bs, S]; tree_mask: [bs, S, S], mask[b, i, j] = j is i
    or an ancestor of i."""
    bs, slots = tokens.shape
    on_path = tree_mask & (depths >= 1).unsqueeze(1)  # [bs, S(i), S(j)]
    counts = base.unsqueeze(1).expand(bs, slots, base.shape[-1]).clone()
    counts.scatter_add_(2, tokens.unsqueeze(1).expand(bs, slots, slots), on_path.to(counts.dtype))
    return counts


# The order SGLang applies a batch's penalties in. A spec worker's batch (and the reference engine) sums the
# additive ones, then scales (`SamplingBatchInfo.copy_for_forward`); SGLang's non-speculative decode applies them
# one by one in its orchestrator's order, a set of classes (`request_kinds.baseline_penalty_order` reads it), and
# the repetition penalty's place in it changes the result.
PENALTIES = ("frequency", "min_new_tokens", "presence", "repetition")


def apply_node_rules(
    logits: Tensor,
    tokens: Tensor,
    tree_mask: Tensor,
    depths: Tensor,
    rules: BatchRules,
    order: Sequence[str] = PENALTIES,
) -> Tensor:
    """The verify logits [bs, S, V] adjusted per node as the baseline adjusts them at that node's position (a new
    tensor, in the logits' dtype): the penalties in `order` (a permutation of PENALTIES), then logit_bias.
    tokens, depths: [bs, S]; tree_mask: [bs, S, S] (see `path_counts`)."""
    if sorted(order) != sorted(PENALTIES):
        raise ValueError(f"order must be a permutation of {PENALTIES}, got {tuple(order)}")
    out = logits.clone()
    counts: Tensor | None = None
    if bool((rules.frequency != 0).any() or (rules.presence != 0).any() or (rules.repetition != 1).any()):
        counts = path_counts(rules.counts, tokens, tree_mask, depths)  # [bs, S, V]
    for penalty in order:
        if penalty == "min_new_tokens":
            suppress = min_new_mask(rules, depths).unsqueeze(-1)  # [bs, S, 1]
            out.add_(torch.where(suppress, rules.stop_penalty[:, None], 0.0).to(out.dtype))
        elif counts is None:
            continue
        elif penalty == "frequency":
            out.sub_((rules.frequency.view(-1, 1, 1) * counts).to(out.dtype))
        elif penalty == "presence":
            out.sub_((rules.presence.view(-1, 1, 1) * (counts > 0)).to(out.dtype))
        else:  # repetition: multiplicative, by the sign of the logit it meets
            scale = torch.where(counts > 0, rules.repetition.view(-1, 1, 1), 1.0).to(out.dtype)
            out = torch.where(out < 0, out * scale, out / scale)
    if rules.logit_bias is not None:
        out.add_(rules.logit_bias[:, None].to(out.dtype))
    return out


def min_new_mask(rules: BatchRules, depths: Tensor) -> Tensor:
    """[bs, S] bool: node i's output so far (committed + its depth) is shorter than min_new_tokens."""
    return (rules.output_lens.unsqueeze(1) + depths) < rules.min_new_tokens.unsqueeze(1)


def chain_layout(width: int, batch: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The tree_mask [bs, W, W] and depths [bs, W] of a chain of `width` tokens (a self-check's re-verify)."""
    mask = torch.ones((width, width), dtype=torch.bool, device=device).tril()
    depths = torch.arange(width, device=device, dtype=torch.int64)
    return mask.expand(batch, width, width), depths.expand(batch, width)


@dataclass(frozen=True)
class SamplerRules:
    """What SGLang's sampler applies after the logit rules: temperature, then top-k, top-p and min-p."""

    temperature: float = 0.0
    top_k: int = -1  # -1 or >= the vocabulary: off; 1: greedy
    top_p: float = 1.0
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def filters(self) -> bool:
        return self.top_k > 1 or self.top_p < 1.0 or self.min_p > 0.0


@dataclass(frozen=True)
class Decoding:
    """One request's decoding: the sampler's settings and the logit rules."""

    sampler: SamplerRules = field(default_factory=SamplerRules)
    rules: RequestRules = field(default_factory=RequestRules)

    @property
    def temperature_only(self) -> bool:
        """Only a temperature (argmax at 0, else one draw from softmax(logits / T)): the fast paths apply."""
        return not self.rules.active and self.sampler == SamplerRules(temperature=self.sampler.temperature)


def adjust_row(logits: Tensor, rules: RequestRules, history: Sequence[int]) -> Tensor:
    """One row of logits [V] adjusted as the baseline adjusts it after the output `history` (a new tensor). The
    history is counted afresh: a decode loop keeps a `RunningRules` instead."""
    if not rules.active:
        return logits
    running = RunningRules(rules, logits.shape[-1], logits.device)
    running.commit(history)
    return running.adjust(logits)


class RunningRules:
    """One request's logit rules with its output so far kept as running state on the device: the rules' fixed
    tensors (penalties, stop tokens, logit_bias) are built once, and the output's token counts [1, V] and length
    are updated by each commit with the tokens it adds (O(new tokens)), never recounted from the history. A
    decode loop commits every token it outputs (a tree round: each accepted draft as the walk accepts it, then
    the bonus) and adjusts each row it chooses from; the rows are those `apply_node_rules` gives for the whole
    output (counts are sums of ones in float32, exact below 2**24, so the same bits in any order)."""

    def __init__(self, rules: RequestRules, vocab: int, device: torch.device) -> None:
        self.rules = rules
        self.vocab = vocab
        self.length = 0  # committed output tokens
        # the counts start at zero: batch_rules of an empty output; force: a rule-less request adjusts nothing
        fixed = batch_rules([rules], [[]], vocab, device, force=True)
        if fixed is None:  # unreachable with force=True
            raise RuntimeError("batch_rules returned no rules")
        self._fixed: BatchRules = fixed
        self.counts = fixed.counts  # [1, V] float32, updated in place
        self._one_node = torch.zeros((1, 1), dtype=torch.int64, device=device)  # tokens / depths of one node
        self._one_mask = torch.ones((1, 1, 1), dtype=torch.bool, device=device)

    def commit(self, tokens: Sequence[int]) -> None:
        """Count `tokens` as output (in order, after what was committed before)."""
        self.length += len(tokens)
        if not self.rules.reads_output:
            return
        ids = [int(t) for t in tokens if 0 <= t < self.vocab]
        if ids:
            index = torch.tensor(ids, dtype=torch.int64).to(self.counts.device)
            self.counts[0].scatter_add_(0, index, torch.ones(index.shape, dtype=self.counts.dtype, device=index.device))

    def batch(self) -> BatchRules:
        """The rules as `apply_node_rules` reads them, for the output committed so far (bs 1)."""
        lens = torch.tensor([self.length], dtype=torch.int64).to(self.counts.device)
        return dataclasses.replace(self._fixed, counts=self.counts, output_lens=lens)

    def adjust(self, logits: Tensor) -> Tensor:
        """One row [V] adjusted as the baseline adjusts it after the committed output (a new tensor; the row
        itself when the request has no rule)."""
        if not self.rules.active:
            return logits
        rows = apply_node_rules(
            logits.view(1, 1, self.vocab), self._one_node, self._one_mask, self._one_node, self.batch()
        )
        return rows.view(self.vocab)


def choose_token(
    logits: Tensor,
    rules: RequestRules,
    sampler: SamplerRules,
    history: Sequence[int],
    generator: torch.Generator | None = None,
) -> int:
    """The baseline's token after the output `history`: logit rules, then `pick_token`. logits: [V]."""
    return pick_token(adjust_row(logits.to(torch.float32), rules, history), sampler, generator)


def pick_token(row: Tensor, sampler: SamplerRules, generator: torch.Generator | None = None) -> int:
    """A token from a row [V] that already carries the logit rules: argmax (greedy) or one draw after
    temperature, top-k, top-p and min-p (SGLang's torch sampler: probabilities sorted, ranks >= top_k zeroed,
    then those whose mass before them exceeds top_p, then those below min_p times the top one)."""
    if sampler.greedy:
        return int(row.argmax())
    probs = torch.softmax(row / sampler.temperature, dim=-1)
    if not sampler.filters:
        return int(torch.multinomial(probs, 1, generator=generator))
    sorted_probs, order = probs.sort(descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    if sampler.top_k > 1:
        sorted_probs[sampler.top_k :] = 0.0
    sorted_probs[before > sampler.top_p] = 0.0
    if sampler.min_p > 0.0:
        sorted_probs[sorted_probs < sorted_probs[0] * sampler.min_p] = 0.0
    return int(order[torch.multinomial(sorted_probs, 1, generator=generator)])


@dataclass(frozen=True)
class BatchWalk:
    """`ddtree.tree.walk_visiting` for n trees at once, on their device. S slots per tree, slot 0 the root."""

    path: Tensor  # [n, S] int64: accepted slots in path order from the root, -1 after
    commit_lens: Tensor  # [n] int64: accepted drafts + 1 (the bonus)
    out_tokens: Tensor  # [n, S] int64: the committed tokens (the accepted drafts, then the bonus), 0 after


def walk_batch(tokens: Tensor, parents: Tensor, real: Tensor, choices: Tensor) -> BatchWalk:
    """The batched walk. tokens, parents, choices: [n, S] (parents[:, 0] = -1; choices[b, i]: the target's choice
    after slot i); real: [n, S] bool, False for padding slots (never accepted). A child is found among real
    slots whose parent is the current slot and whose token is its choice; ties go to the lowest slot."""
    n, slots = tokens.shape
    rows = torch.arange(n, device=tokens.device)
    current = torch.zeros(n, dtype=torch.int64, device=tokens.device)
    alive = torch.ones(n, dtype=torch.bool, device=tokens.device)
    path = torch.full((n, slots), -1, dtype=torch.int64, device=tokens.device)
    path[:, 0] = 0
    out = torch.zeros((n, slots), dtype=torch.int64, device=tokens.device)
    lens = torch.ones(n, dtype=torch.int64, device=tokens.device)
    for step in range(slots):
        choice = choices[rows, current]  # [n]
        out[:, step] = torch.where(alive, choice, out[:, step])
        match = (parents == current.unsqueeze(1)) & (tokens == choice.unsqueeze(1)) & real  # [n, S]
        found = match.any(dim=1) & alive
        if not bool(found.any()) or step + 1 == slots:
            break
        child = match.to(torch.int8).argmax(dim=1)  # the lowest matching slot
        path[:, step + 1] = torch.where(found, child, path[:, step + 1])
        current = torch.where(found, child, current)
        lens += found.to(torch.int64)
        alive = found
    return BatchWalk(path=path, commit_lens=lens, out_tokens=out)
