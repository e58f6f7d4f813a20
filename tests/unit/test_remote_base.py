from __future__ import annotations

import pytest

from opsctl.commands import Cmd, Masked, Raw, sh
from opsctl.errors import RemoteError
from opsctl.remote.base import RunResult, SecretOnCommandLine, checked, command_line, temp_name


def test_command_line_quotes_argv() -> None:
    assert command_line("h", Cmd.of("echo", "a b", "$HOME"), as_root=True) == "echo 'a b' '$HOME'"


def test_sudo_only_when_not_root_and_keeps_operators_under_sudo() -> None:
    cmd = Cmd.of("systemctl", "daemon-reload", Raw("&&"), "systemctl", "restart", "x", sudo=True)
    assert command_line("h", cmd, as_root=True) == "systemctl daemon-reload && systemctl restart x"
    assert command_line("h", cmd, as_root=False) == "sudo -n -- sh -c 'systemctl daemon-reload && systemctl restart x'"
    assert command_line("h", Cmd.of("id"), as_root=False) == "id"


def test_secrets_on_a_command_line_are_refused_and_masked_in_the_error() -> None:
    cmd = Cmd.of("curl", "-H", Masked("Bearer hunter2"), "http://x")
    with pytest.raises(SecretOnCommandLine) as info:
        command_line("gpu1", cmd, as_root=True)
    text = info.value.one_line()
    assert "hunter2" not in text
    assert text.startswith("gpu1: refusing to run `curl -H *** http://x`")
    assert "stdin" in (info.value.hint or "")


def test_stdin_is_not_part_of_the_command_or_its_repr() -> None:
    cmd = Cmd.of("sh", "-c", "read s", stdin="hunter2")
    assert "hunter2" not in command_line("h", cmd, as_root=True)
    assert "hunter2" not in repr(cmd)


def test_checked_raises_with_exit_code_and_tail() -> None:
    bad = RunResult("h", "false", 3, "", "line1\nreason\n", 0.1)
    with pytest.raises(RemoteError) as info:
        checked(bad, check=True)
    assert info.value.remote_exit_code == 3
    assert info.value.one_line() == "h: `false` exited 3: reason"
    assert checked(bad, check=False) is bad
    good = RunResult("h", "true", 0, "", "", 0.1)
    assert checked(good, check=True).ok


def test_result_tail_is_the_last_ten_lines() -> None:
    result = RunResult("h", "x", 1, "\n".join(f"o{i}" for i in range(20)), "e1\n", 0.0)
    assert result.tail.splitlines() == [f"o{i}" for i in range(11, 20)] + ["e1"]


def test_temp_name_is_a_hidden_sibling() -> None:
    name = temp_name("/etc/systemd/system/opsctl-a.service")
    assert name.startswith("/etc/systemd/system/.opsctl-a.service.opsctl-tmp-")
    assert temp_name("/x/y") != temp_name("/x/y")


def test_sh_scripts_are_one_argument() -> None:
    assert command_line("h", sh("a | b"), as_root=True) == "sh -c 'a | b'"
