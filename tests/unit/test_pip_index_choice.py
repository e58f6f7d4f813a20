"""Package indexes for the wheelhouse download: pip's configuration, the lock's index lines, the decision."""

from __future__ import annotations

from pathlib import Path

from opsctl import pip_index
from opsctl.pip_index import PYPI, PipIndexes

# `python -m pip config list` on a control machine with a global file and PIP_* variables (recorded).
CONFIG_LIST = """\
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
global.index-url='https://mirror.example/simple'
download.index-url='https://download-mirror.example/simple'
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels /opt/more-wheels'
"""

LOCK = """\
# Reference engine
--extra-index-url https://download.pytorch.org/whl/cpu
torch==2.13.0
uvicorn>=0.29  # server
"""


def test_config_list_is_parsed_with_pips_precedence() -> None:
    got = pip_index.parse_config_list(CONFIG_LIST)
    assert got == PipIndexes(
        index_url="https://download-mirror.example/simple",  # the download section beats global
        extra_index_urls=("file:///opt/pypi/simple", "file:///opt/pypi-more/simple"),
        find_links=("/opt/wheels", "/opt/more-wheels"),  # PIP_FIND_LINKS beats the file
    )
    assert pip_index.parse_config_list("") == PipIndexes(index_url=PYPI)
    assert pip_index.parse_config_list("garbage\nglobal.no-index='true'\nuser.x=\"'\n").no_index


def test_lock_index_lines_are_split_from_the_body() -> None:
    got = pip_index.parse_lock(LOCK + "-i https://idx.example/simple\n--extra-index-url=https://b.example\n")
    assert got.index_url == "https://idx.example/simple"
    assert got.extra_index_urls == ("https://download.pytorch.org/whl/cpu", "https://b.example")
    assert got.body == ("# Reference engine", "torch==2.13.0", "uvicorn>=0.29  # server")


def test_everything_reachable_changes_nothing() -> None:
    choice = pip_index.choose(LOCK, PipIndexes(), {})
    assert (choice.requirements, dict(choice.env), choice.skipped, choice.error) == (LOCK, {}, (), None)


def test_an_unreachable_lock_index_is_skipped_and_named() -> None:
    torch_index = "https://download.pytorch.org/whl/cpu"
    config = PipIndexes(extra_index_urls=("file:///opt/pypi/simple",))
    choice = pip_index.choose(LOCK, config, {torch_index: "no answer within 3s"})
    assert choice.requirements == "# Reference engine\ntorch==2.13.0\nuvicorn>=0.29  # server\n"
    assert dict(choice.env) == {"PIP_INDEX_URL": PYPI, "PIP_EXTRA_INDEX_URL": "file:///opt/pypi/simple"}
    assert choice.notes() == [f"skipping package index {torch_index}: unreachable (no answer within 3s)"]
    assert choice.error is None


def test_an_unreachable_main_index_gives_way_to_a_reachable_extra() -> None:
    config = PipIndexes(extra_index_urls=("https://a.example/simple", "https://b.example/simple"))
    choice = pip_index.choose("x==1\n", config, {PYPI: "connection refused", "https://a.example/simple": "refused"})
    assert dict(choice.env) == {"PIP_INDEX_URL": "https://b.example/simple", "PIP_EXTRA_INDEX_URL": ""}


def test_find_links_alone_is_enough_and_nothing_at_all_is_an_error() -> None:
    down = {PYPI: "connection refused", "https://download.pytorch.org/whl/cpu": "no answer within 3s"}
    links = pip_index.choose(LOCK, PipIndexes(find_links=("/opt/wheels",)), down)
    assert dict(links.env) == {"PIP_NO_INDEX": "1"} and links.error is None
    none = pip_index.choose(LOCK, PipIndexes(), down)
    assert none.error == "no package index is reachable: https://pypi.org/simple (connection refused) and 1 more"


def test_no_index_in_pip_config_probes_nothing() -> None:
    asked: list[list[str]] = []
    choice = pip_index.decide(LOCK, PipIndexes(no_index=True), prober=lambda urls: asked.append(list(urls)) or {})
    assert asked == [] and choice.error is None


def test_decide_probes_every_index_once() -> None:
    asked: list[list[str]] = []

    def prober(urls: object) -> dict[str, str | None]:
        asked.append(list(urls))  # type: ignore[call-overload]
        return {}

    pip_index.decide(LOCK, PipIndexes(extra_index_urls=("file:///x",)), prober=prober)
    assert asked == [[PYPI, "file:///x", "https://download.pytorch.org/whl/cpu"]]


def test_credentials_in_an_index_url_are_never_shown() -> None:
    url = "https://user:s3cret@private.example:8443/simple"
    choice = pip_index.choose(f"--index-url {url}\nx\n", PipIndexes(), {url: "timed out"})
    assert "s3cret" not in (choice.error or "") and "user" not in (choice.error or "")
    assert pip_index.shown(url) == "https://***@private.example:8443/simple"


def test_local_indexes_are_probed_on_disk(tmp_path: Path) -> None:
    assert pip_index.probe(f"file://{tmp_path}") is None
    assert pip_index.probe(f"file://{tmp_path}/missing") == f"{tmp_path}/missing is not a directory"
    assert pip_index.probe(str(tmp_path)) is None
