"""opsctl.logs: journalctl commands, output parsing with the cursor, and the cursor-polling follow loop."""

from opsctl.logs import Source, follow, valid_grep
from opsctl.systemd import JournalQuery, journal_cmd, parse_journal

JOURNAL = """2026-11-29T22:40:01+0000 lab1 opsctl-ref[912]: INFO ddtree: DDTREE init mode=tree budget=32
-- No entries --
2026-11-29T22:40:02+0000 lab1 opsctl-ref[912]: hello
-- cursor: s=abc;i=2f
"""


def test_journal_cmd_exact():
    q = JournalQuery("opsctl-ref.service", since="10 min ago", lines=50)
    assert journal_cmd(q).display() == (
        "journalctl -u opsctl-ref.service --no-pager -o short-iso --show-cursor --since '10 min ago' -n 50"
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
