"""Synthetic chat corpus for the tiny target: short, structured tasks whose answers follow from the prompt.

The point is a target whose greedy continuations are confident and structured (English-ish sentences, counting,
JSON, Python), so a drafter has something real to learn and acceptance lengths mean something. Every sample is
drawn from a seeded `random.Random`; held-out prompts use their own seed and skip any prompt seen in training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .tokenizer import END_THINK, IM_END, THINK

NAMES = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory", "oscar")
CITIES = ("paris", "tokyo", "lima", "oslo", "cairo", "delhi", "rome", "quito", "seoul", "austin")
WORDS = ("blue", "sky", "green", "tree", "red", "apple", "small", "house", "quiet", "river", "fast", "train")
FRUITS = ("apple", "banana", "cherry", "grape", "lemon", "mango", "orange", "peach", "pear")
ANIMALS = {
    "fox": ("quick", "berries", "forest"),
    "cat": ("lazy", "fish", "house"),
    "dog": ("loyal", "bones", "garden"),
    "owl": ("wise", "mice", "barn"),
    "bear": ("strong", "honey", "cave"),
    "duck": ("noisy", "bread", "pond"),
    "horse": ("tall", "hay", "stable"),
    "frog": ("green", "flies", "swamp"),
}
SPELL = ("garden", "window", "yellow", "pencil", "rocket", "butter", "planet", "silver", "candle", "forest")
OPS = (("add", "+"), ("sub", "-"), ("mul", "*"))


@dataclass(frozen=True)
class Sample:
    prompt: str  # the user message
    thought: str  # reasoning shown inside <think> when thinking is on
    answer: str  # the assistant's reply


def _count(rng: random.Random) -> Sample:
    a = rng.randint(0, 60)
    b = a + rng.randint(4, 9)
    return Sample(f"count from {a} to {b}", f"i count up by one from {a}.", " ".join(map(str, range(a, b + 1))))


def _repeat(rng: random.Random) -> Sample:
    word = rng.choice(WORDS)
    n = rng.randint(2, 5)
    return Sample(f'repeat "{word}" {n} times', f"i write {word} {n} times.", " ".join([word] * n))


def _json(rng: random.Random) -> Sample:
    name, city, age = rng.choice(NAMES), rng.choice(CITIES), rng.randint(18, 90)
    answer = f'{{"name": "{name}", "age": {age}, "city": "{city}"}}'
    return Sample(f"json for {name}, age {age}, from {city}", "i make a json object.", answer)


def _code(rng: random.Random) -> Sample:
    fname, op = rng.choice(OPS)
    x, y = rng.randint(1, 9), rng.randint(1, 9)
    answer = f"def {fname}(a, b):\n    return a {op} b\n\nprint({fname}({x}, {y}))"
    return Sample(f"write {fname} for {x} and {y}", f"i write a python function {fname}.", answer)


def _animal(rng: random.Random) -> Sample:
    animal = rng.choice(sorted(ANIMALS))
    adj, food, home = ANIMALS[animal]
    answer = f"the {animal} is {adj}. the {animal} eats {food}. the {animal} lives in the {home}."
    return Sample(f"tell me about the {animal}", f"i describe the {animal}.", answer)


def _spell(rng: random.Random) -> Sample:
    word = rng.choice(SPELL)
    return Sample(f"spell {word}", "i spell it letter by letter.", "-".join(word))


def _fruits(rng: random.Random) -> Sample:
    n = rng.randint(2, 6)
    answer = "\n".join(f"{i + 1}. {f}" for i, f in enumerate(FRUITS[:n]))
    return Sample(f"list {n} fruits", f"i list {n} fruits.", answer)


TASKS = (_count, _repeat, _json, _code, _animal, _spell, _fruits)
# tasks whose prompt space is large enough that a 3000-sample corpus leaves most prompts unseen
HELDOUT_TASKS = (_count, _json, _code)


def sample(rng: random.Random) -> Sample:
    return rng.choice(TASKS)(rng)


def completion(s: Sample, thinking: bool) -> str:
    """The assistant text after the generation prompt (which already holds the empty think block when off)."""
    if thinking:
        return f"{THINK}\n{s.thought}\n{END_THINK}\n\n{s.answer}{IM_END}"
    return f"{s.answer}{IM_END}"


def training_samples(n: int, seed: int) -> list[tuple[Sample, bool]]:
    """n (sample, thinking) pairs; a quarter of them show a thought."""
    rng = random.Random(seed)
    return [(sample(rng), rng.random() < 0.25) for _ in range(n)]


def heldout_prompts(n: int, seed: int, exclude: set[str]) -> list[str]:
    """n distinct user prompts never seen in training (prompts in `exclude` are skipped), tasks in turn."""
    rng = random.Random(seed)
    out: list[str] = []
    seen = set(exclude)
    while len(out) < n:
        p = HELDOUT_TASKS[len(out) % len(HELDOUT_TASKS)](rng).prompt
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out
