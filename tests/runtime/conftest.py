"""Session fixtures for the runtime tier: the tiny models built by `python -m ddtree.tiny`, and the SGLang
engine host every SGLang Engine test shares.

`tiny_dense` / `tiny_hybrid` return a directory DIR with DIR/target (model + tokenizer) and DIR/draft (DFlash
drafter), from the one tiny-model cache of the run (tests/runtime/tiny_cache.py: DDTREE_TINY_CACHE, else
/var/cache/opsctl/tiny as root, shared with the lab, else <repo>/.cache/tiny), built on first use under a lock.

`sglang_engine` (tests/runtime/sglang_host.py) runs SGLang's real Engine on CPU: a new engine test asks it for
its run instead of launching its own subprocess, e.g.

    result, log = sglang_engine.run("tree", engine_kwargs(target), [prompts], 32, TREE_ENV)

(`engine_kwargs` and the mode environments are in test_sglang_engine.py). A run is one Engine launch with every
batch of the job (one `Engine.generate` call each), and is memoised by all its arguments, so tests that need
the same engine, prompts and settings share one launch: put the prompts a test needs in one batch of an
existing run where only the tokens matter, rather than starting another Engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_parts import RuntimePartError, in_part, part
from sglang_cpu import sglang_skip_reason
from sglang_host import EngineHost
from tiny_cache import ensure_tiny

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """OPSCTL_RUNTIME_PART=1|2: this pytest runs only its part's runtime modules (tests/runtime/runtime_parts.py)."""
    try:
        part()
    except RuntimePartError as exc:
        raise pytest.UsageError(str(exc)) from None
    keep, drop = [], []
    for item in items:
        (keep if item.path.parent != HERE or in_part(item.path.name) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def tiny_dense() -> Path:
    """Tiny dense Qwen3 target + distilled DFlash drafter: DIR/target, DIR/draft."""
    return ensure_tiny("qwen3")


@pytest.fixture(scope="session")
def tiny_hybrid() -> Path:
    """Tiny hybrid Qwen3.5 target (3 Gated DeltaNet + 1 attention layer) + distilled drafter."""
    return ensure_tiny("qwen3_5")


_ENGINE_HOST = EngineHost()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the engine host as soon as a selected test uses it: its SGLang import overlaps the tests before."""
    if session.config.option.collectonly or sglang_skip_reason() is not None:
        return
    if any("sglang_engine" in getattr(item, "fixturenames", ()) for item in session.items):
        _ENGINE_HOST.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _ENGINE_HOST.close()


@pytest.fixture(scope="session")
def sglang_engine() -> EngineHost:
    """The SGLang engine host of the whole run (runs and logs under its workdir, /tmp/sglang-host-*; closed when
    the session ends)."""
    return _ENGINE_HOST
