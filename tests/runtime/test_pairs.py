"""ddtree.pairs at the CPU scale: the corpus checks and split, and one build of each architecture
end to end (seconds), with its cache reused. The corpus here is a wheel made of this repository's own runtime
sources, pinned by its sha256 like the real manifest's (the real wheels come from PyPI, not from CI)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from ddtree.pairs import corpus, ensure

pytestmark = pytest.mark.runtime
RUNTIME = Path(__file__).resolve().parents[2] / "runtime" / "ddtree"


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[corpus.Pin, ...]]:
    out = tmp_path_factory.mktemp("wheels")
    path = out / "ddtree_src-0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for src in sorted(RUNTIME.rglob("*.py")):
            zf.writestr(f"ddtree/{src.relative_to(RUNTIME)}", src.read_text())
        zf.writestr("ddtree_src-0.dist-info/METADATA", "Name: ddtree_src\n")
    pin = corpus.Pin("ddtree_src", "0", path.name, hashlib.sha256(path.read_bytes()).hexdigest())
    return out, (pin,)


def test_split_is_by_file_and_seeded(wheel_dir: tuple[Path, tuple[corpus.Pin, ...]]) -> None:
    wheels, manifest = wheel_dir
    docs = corpus.load(wheels, manifest)
    assert docs and all(".dist-info/" not in d.path for d in docs)
    train, heldout = corpus.split(docs, seed=0, heldout_fraction=0.3)
    assert train and heldout and not {d.path for d in train} & {d.path for d in heldout}
    assert (train, heldout) == corpus.split(docs, seed=0, heldout_fraction=0.3)
    assert {d.path for d in heldout} != {d.path for d in corpus.split(docs, seed=1, heldout_fraction=0.3)[1]}
    passages = corpus.samples(heldout, seed=0, prompt_chars=64, completion_chars=64)
    held_text = "".join(d.text for d in heldout)
    assert passages and all(s.prompt + s.completion in held_text for s in passages)


def test_a_wheel_that_differs_is_refused(wheel_dir: tuple[Path, tuple[corpus.Pin, ...]], tmp_path: Path) -> None:
    wheels, (pin,) = wheel_dir
    other = corpus.Pin(pin.name, pin.version, pin.filename, "0" * 64)
    with pytest.raises(corpus.CorpusError, match="is not the pinned"):
        corpus.load(wheels, (other,))
    with pytest.raises(corpus.CorpusError, match="is missing"):
        corpus.load(tmp_path, (pin,))


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_build_then_reuse(arch: str, wheel_dir: tuple[Path, tuple[corpus.Pin, ...]], tmp_path: Path) -> None:
    wheels, manifest = wheel_dir
    out, built = ensure(arch, wheels, tmp_path, scale="ci", manifest=manifest)
    assert built
    report = json.loads((out / "build.json").read_text())
    assert report["corpus"]["hash"] == corpus.corpus_hash(manifest)
    assert report["heldout_perplexity_per_byte"] > 1 and len(report["greedy_samples"]) == 2
    config = json.loads((out / "target" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    if arch == "qwen3_5":  # SGLang needs it to lay out the GDN and attention layers
        assert config["full_attention_interval"] == 3
        assert config["layer_types"] == ["linear_attention", "linear_attention", "full_attention"]
    assert json.loads((out / "draft" / "config.json").read_text())["dflash_config"]["target_layer_ids"] == [0, 1]
    _, heldout = corpus.split(corpus.load(wheels, manifest), 0, 0.1)
    held_text = "".join(d.text for d in heldout)
    assert all(p in held_text for p in json.loads((out / "heldout.json").read_text()))
    assert ensure(arch, wheels, tmp_path, scale="ci", manifest=manifest) == (out, False)
