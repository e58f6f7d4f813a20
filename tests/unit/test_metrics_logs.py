"""opsctl.logs: journalctl commands, output parsing with the cursor, and the cursor-polling follow loop."""

import os
import subprocess
from pathlib import Path

import pytest

from opsctl.logs import Source, follow, valid_grep
from opsctl.systemd import JournalPage, JournalQuery, journal_cmd, parse_journal, parse_journal_page

JOURNAL = """2026-11-29T22:40:01+0000 lab1 opsctl-ref[912]: INFO ddtree: DDTREE init mode=tree budget=32
-- No entries --
2026-11-29T22:40:02+0000 lab1 opsctl-ref[912]: hello
-- cursor: s=abc;i=2f
"""


def test_journal_cmd_exact():
    q = JournalQuery("opsctl-ref.service", since="10 min ago", lines=50)
    window = journal_cmd(q)
    assert window.argv[:4] == ("bash", "-o", "pipefail", "-c") and window.sudo
    assert str(window.argv[4]).startswith(
        "journalctl -u opsctl-ref.service --no-pager -o short-iso --show-cursor --since '10 min ago' | awk -v n=50 "
    )
    assert " -n " not in str(window.argv[4])  # journalctl's -n beside --since takes the window's oldest lines
    latest = JournalQuery("opsctl-ref.service", lines=50)
    assert journal_cmd(latest).display() == (
        "journalctl -u opsctl-ref.service --no-pager -o short-iso --show-cursor -n 50"
    )
    follow_q = JournalQuery("opsctl-ref.service", since="10 min ago", lines=50, cursor="s=abc;i=2f")
    assert journal_cmd(follow_q).display() == (
        "journalctl -u opsctl-ref.service --no-pager -o short-iso --show-cursor --after-cursor 's=abc;i=2f'"
    )
    grep = journal_cmd(JournalQuery("opsctl-ref.service", lines=None, grep="DDTREE |Decode batch")).display()
    assert grep.startswith("sh -c ") and "grep -E --" in grep and "|| true" in grep and "-- cursor: " in grep
    assert journal_cmd(q).sudo


def test_parse_journal():
    lines, cursor = parse_journal(JOURNAL)
    assert cursor == "s=abc;i=2f"
    assert len(lines) == 2 and lines[1].endswith("hello")
    assert parse_journal("") == ([], None)


def _recorded_journal(n: int) -> str:
    """journalctl -o short-iso --show-cursor output of n lines, a boot separator among them."""
    rows = [f"2026-11-29T22:{i // 60 % 60:02d}:{i % 60:02d}+0000 lab1 opsctl-ref[912]: line {i}" for i in range(n)]
    rows.insert(n // 2, "-- Boot 0f1e2d3c4b5a69788796a5b4c3d2e1f0 --")
    return "\n".join([*rows, "-- cursor: s=abc;i=2f", ""])


def _run_on_recorded(tmp_path: Path, q: JournalQuery, journal: str, rc: int = 0) -> subprocess.CompletedProcess[str]:
    """The command journal_cmd builds, run by the real bash, awk and grep, with journalctl answering `journal`."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (tmp_path / "journal.txt").write_text(journal)
    fake = bindir / "journalctl"
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'journal.txt'}\nexit {rc}\n")
    fake.chmod(0o755)
    cmd = journal_cmd(q)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    return subprocess.run(cmd.shell(), shell=True, env=env, capture_output=True, text=True, timeout=30, check=False)


def test_since_window_shows_its_latest_lines_and_counts_what_it_left_out(tmp_path: Path) -> None:
    out = _run_on_recorded(tmp_path, JournalQuery("u", since="15 min ago", lines=200), _recorded_journal(1000))
    page = parse_journal_page(out.stdout)
    assert out.returncode == 0, out.stderr
    assert [line.rsplit(" ", 1)[1] for line in page.lines] == [str(i) for i in range(800, 1000)]
    assert page.left_out == 800 and page.cursor == "s=abc;i=2f"


def test_since_window_that_fits_cuts_nothing(tmp_path: Path) -> None:
    out = _run_on_recorded(tmp_path, JournalQuery("u", since="15 min ago", lines=200), _recorded_journal(7))
    recorded = [ln for ln in _recorded_journal(7).splitlines() if " line " in ln]
    assert len(recorded) == 7 and parse_journal_page(out.stdout) == JournalPage(recorded, "s=abc;i=2f", 0)
    empty = _run_on_recorded(tmp_path, JournalQuery("u", since="1 min ago", lines=5), "-- No entries --\n")
    assert parse_journal_page(empty.stdout) == JournalPage([], None, 0)


def test_since_window_with_grep_counts_matching_lines_only(tmp_path: Path) -> None:
    q = JournalQuery("u", since="15 min ago", lines=3, grep="line [0-9]*7$")
    page = parse_journal_page(_run_on_recorded(tmp_path, q, _recorded_journal(100)).stdout)
    assert [line.rsplit(" ", 1)[1] for line in page.lines] == ["77", "87", "97"]
    assert page.left_out == 7 and page.cursor == "s=abc;i=2f"  # 7, 17, ..., 67


def test_since_window_fails_when_journalctl_fails(tmp_path: Path) -> None:
    out = _run_on_recorded(tmp_path, JournalQuery("u", since="yesterdayish", lines=5), "", rc=1)
    assert out.returncode == 1


@pytest.mark.parametrize("left_out", ["", "x", "-3"])
def test_malformed_left_out_line_is_not_a_count(left_out: str) -> None:
    assert parse_journal_page(f"-- opsctl left out: {left_out}\nhello\n") == JournalPage(["hello"], None, 0)


def test_follow_polls_by_cursor():
    calls: list[JournalQuery] = []
    answers = iter([JOURNAL, "-- cursor: s=abc;i=30\n", "2026 x\n-- cursor: s=abc;i=31\n"])

    def fetch(q: JournalQuery) -> str:
        calls.append(q)
        return next(answers)

    slept: list[float] = []
    out = list(follow([Source("lab1/ref", fetch, JournalQuery("u", lines=10))], slept.append, rounds=3))
    assert [line for _, line in out][-1] == "2026 x" and len(out) == 3
    assert [c.cursor for c in calls] == [None, "s=abc;i=2f", "s=abc;i=30"]
    assert slept == [1.0, 1.0]


def test_valid_grep():
    assert valid_grep("DDTREE (init|metrics)")
    assert not valid_grep("(unclosed")
    assert not valid_grep("a\nb")
