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

`reference_servers` (tests/runtime/serve_process.py) is the run's reference servers, one `python -m ddtree.serve`
per (arch, mode), started on first use: `reference_servers("dense", "baseline")`. They stop (and must exit 0)
after the last selected test that uses them, so they are not held through the rest of the tier.

`sglang_probes` runs the SGLang contract probes of the selected modules (test_sglang_plugin, test_sglang_layout,
test_sglang_hybrid_graphs: each module's `sglang_probe(tmp) -> Probe`) in one subprocess that imports SGLang once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_parts import RuntimePartError, in_part, part
from serve_process import ServerPool
from sglang_cpu import ProbeResult, run_probes, sglang_skip_reason
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


_SERVERS = pytest.StashKey[ServerPool]()  # the session's reference servers, once a test asked for them
_LAST_SERVER_TEST = pytest.StashKey[pytest.Item]()  # the last selected test that uses them


def pytest_collection_finish(session: pytest.Session) -> None:
    """Note the last selected test that uses the reference servers; start the engine host as soon as a selected
    test uses it: its SGLang import overlaps the tests before."""
    users = [item for item in session.items if "reference_servers" in getattr(item, "fixturenames", ())]
    if users:
        session.stash[_LAST_SERVER_TEST] = users[-1]
    if session.config.option.collectonly or sglang_skip_reason() is not None:
        return
    if any("sglang_engine" in getattr(item, "fixturenames", ()) for item in session.items):
        _ENGINE_HOST.start()


def _stop_reference_servers(session: pytest.Session) -> None:
    if _SERVERS in session.stash:
        codes = session.stash[_SERVERS].stop_all()
        assert all(code == 0 for code in codes.values()), codes  # every server exits 0 on SIGTERM


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test that uses them, the reference servers stop: ~0.5 GB each, idle for the rest of the run."""
    if item is item.session.stash.get(_LAST_SERVER_TEST, None):
        _stop_reference_servers(item.session)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _ENGINE_HOST.close()
    _stop_reference_servers(session)  # a run that ended before the last user (-x, Ctrl-C)


@pytest.fixture(scope="session")
def sglang_engine() -> EngineHost:
    """The SGLang engine host of the whole run (runs and logs under its workdir, /tmp/sglang-host-*; closed when
    the session ends)."""
    return _ENGINE_HOST


@pytest.fixture(scope="session")
def reference_servers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ServerPool:
    """reference_servers(arch, mode, *also) -> a ready reference server on the tiny dense or hybrid models (the
    `also` modes start beside it, so their start-ups overlap); stopped after the last test that uses it."""

    def models(arch: str) -> Path:
        return Path(request.getfixturevalue("tiny_dense" if arch == "dense" else "tiny_hybrid"))

    pool = request.session.stash[_SERVERS] = ServerPool(models, tmp_path_factory.mktemp)
    return pool


@pytest.fixture(scope="session")
def sglang_probes(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, ProbeResult]:
    """Each selected module's probe result, by module name: the modules whose tests use this fixture define
    `sglang_probe(tmp: Path) -> Probe`; all run in one process after one SGLang import (sglang_cpu.run_probes)."""
    reason = sglang_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    users = {item.module for item in request.session.items if "sglang_probes" in getattr(item, "fixturenames", ())}
    probes = {m.__name__: m.sglang_probe(tmp_path_factory.mktemp(m.__name__)) for m in users}
    return run_probes(dict(sorted(probes.items())), tmp_path_factory.mktemp("sglang_probes"))
