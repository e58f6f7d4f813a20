"""ddtree.serve flags: SGLang names, --config files, API key sources, mode resolution."""

from __future__ import annotations

from pathlib import Path

import pytest
from ddtree.serve.args import (
    HOLD_LOADING_ENV,
    Mode,
    SpecAlgorithm,
    parse_args,
    resolve_api_key,
    resolve_device,
    resolve_dtype,
    resolve_mode,
)

pytestmark = pytest.mark.runtime


def test_defaults_follow_sglang() -> None:
    a = parse_args(["--model-path", "/m"], environ={})
    assert (a.host, a.port, a.served_model_name, a.speculative_algorithm) == ("127.0.0.1", 30000, "/m", None)
    assert a.api_key is None and a.api_key_source == "none"
    assert a.reasoning_parser == "qwen3"


def test_opsctl_speculative_flags_are_accepted_and_recorded() -> None:
    argv = [
        "--model-path", "/m", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "/d",
        "--disable-overlap-schedule", "--page-size", "1", "--attention-backend", "triton",
        "--speculative-num-draft-tokens", "16", "--mem-fraction-static", "0.8", "--enable-metrics",
        "--trust-remote-code", "--tp-size", "1", "--log-level", "WARNING",
    ]  # fmt: skip
    a = parse_args(argv, environ={})
    assert a.speculative_algorithm is SpecAlgorithm.DDTREE and a.draft_model_path == "/d"
    assert a.log_level == "warning"
    info = a.public_dict()
    assert info["disable_overlap_schedule"] is True and info["page_size"] == 1
    assert info["attention_backend"] == "triton" and info["speculative_num_draft_tokens"] == 16
    assert info["mem_fraction_static"] == 0.8 and info["tp_size"] == 1 and info["enable_metrics"] is True


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model-path", "/m", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--model-path", "/m", "--speculative-algorithm", "EAGLE"], "invalid choice: 'EAGLE'"),
        (["--model-path", "/m", "--speculative-algorithm", "DFLASH"], "needs --speculative-draft-model-path"),
        (["--model-path", "/m", "--port", "70000"], "must be in 1..65535"),
        (["--model-path", "/m", "--disable-overlap"], "unrecognized arguments"),  # no abbreviations
        ([], "the following arguments are required: --model-path"),
    ],
)
def test_bad_flags_exit_2_with_argparse_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv, environ={})
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_api_key_sources_and_precedence(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_text("from-file\nignored\n")
    assert resolve_api_key("from-flag", None, {"SGLANG_API_KEY": "e"}) == ("from-flag", "flag")
    assert resolve_api_key(None, str(f), {"SGLANG_API_KEY": "e"}) == ("from-file", "file")
    assert resolve_api_key(None, None, {"SGLANG_API_KEY": " from-env "}) == ("from-env", "env")
    assert resolve_api_key(None, None, {}) == (None, "none")
    with pytest.raises(ValueError, match="mutually exclusive"):
        resolve_api_key("a", str(f), {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="file is empty"):
        resolve_api_key(None, str(tmp_path / "empty"), {})
    with pytest.raises(ValueError, match="No such file"):
        resolve_api_key(None, str(tmp_path / "missing"), {})


def test_api_key_never_in_public_dict_or_repr() -> None:
    a = parse_args(["--model-path", "/m"], environ={"SGLANG_API_KEY": "s3cret"})
    assert a.api_key == "s3cret" and a.api_key_source == "env"
    assert "s3cret" not in repr(a) and "s3cret" not in str(a.public_dict())
    assert a.public_dict()["api_key"] == "***"


def test_config_file_merges_like_sglang(tmp_path: Path) -> None:
    cfg = tmp_path / "server.yaml"
    cfg.write_text(
        'model-path: "/dev/shm/M"\nport: 30001\napi-key: "k1"\ndisable-overlap-schedule: true\n'
        "trust-remote-code: false\nspeculative-algorithm: DFLASH\nspeculative-draft-model-path: /d\n"
    )
    a = parse_args(["--config", str(cfg), "--port", "30005"], environ={})
    assert a.model_path == "/dev/shm/M" and a.port == 30005  # the command line wins over the file
    assert a.api_key == "k1" and a.api_key_source == "flag"
    assert a.compat["disable_overlap_schedule"] is True and a.compat["trust_remote_code"] is False
    assert resolve_mode(a.speculative_algorithm, None) is Mode.LINEAR


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        ("model-path: /m\nbogus-key: 1\n", "s.yaml", "unrecognized arguments: --bogus-key 1"),
        ("- a\n- b\n", "s.yaml", "top level must be a mapping"),
        ("model-path: /m\n", "s.json", "must be a .yaml or .yml file"),
        ("model-path: [unclosed\n", "s.yaml", "not valid YAML"),
    ],
)
def test_bad_config_file_exits_2(
    tmp_path: Path, content: str, name: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / name
    cfg.write_text(content)
    with pytest.raises(SystemExit) as exc:
        parse_args(["--config", str(cfg)], environ={})
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_mode_from_flags_and_env() -> None:
    assert resolve_mode(None, None) is Mode.BASELINE
    assert resolve_mode(SpecAlgorithm.DFLASH, "tree") is Mode.LINEAR  # DDTREE_VERIFY only matters for DDTREE
    assert resolve_mode(SpecAlgorithm.DDTREE, "shadow") is Mode.SHADOW
    assert resolve_mode(SpecAlgorithm.DDTREE, "tree") is Mode.TREE
    with pytest.raises(ValueError, match="DDTREE_VERIFY"):
        resolve_mode(SpecAlgorithm.DDTREE, "chain")


def test_device_and_dtype() -> None:
    assert resolve_device("auto", cuda_available=False) == "cpu"
    assert resolve_device("auto", cuda_available=True) == "cuda"
    assert resolve_device("cuda:1", cuda_available=True) == "cuda:1"
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda", cuda_available=False)
    with pytest.raises(ValueError, match="expected auto, cpu"):
        resolve_device("tpu", cuda_available=False)
    assert resolve_dtype("auto", "cpu") == "float32" and resolve_dtype("auto", "cuda") == "bfloat16"
    assert parse_args(["--model-path", "/m", "--dtype", "half"], environ={}).dtype == "float16"


def test_tokenizer_path_is_a_real_flag(tmp_path: Path) -> None:
    from ddtree.serve.__main__ import _resolve

    args = parse_args(["--model-path", str(tmp_path), "--tokenizer-path", str(tmp_path / "tok")])
    assert args.tokenizer_path == str(tmp_path / "tok") and args.public_dict()["tokenizer_path"] == args.tokenizer_path
    assert parse_args(["--model-path", "m"]).tokenizer_path is None
    with pytest.raises(ValueError, match=r"^--tokenizer-path .*/tok: not a directory$"):  # as SGLang, refused at start
        _resolve(args)


def test_tokenizer_is_loaded_from_tokenizer_path(tiny_dense: Path, tmp_path: Path) -> None:
    """The engine's tokenizer comes from --tokenizer-path: a copy whose chat template differs shows which one."""
    import shutil

    from ddtree.serve.chat import render_chat
    from ddtree.serve.loader import load_engine
    from ddtree.serve.protocol import ChatMessage

    target = Path(tiny_dense) / "target"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(target / name, tmp_path / name)
    (tmp_path / "chat_template.jinja").write_text("MARK {{ messages[0]['content'] }}")
    engine = load_engine(str(target), None, Mode.BASELINE, None, "cpu", "float32", tokenizer_path=str(tmp_path))
    ids = render_chat(engine.tokenizer, [ChatMessage("user", "hi")], {})
    assert engine.tokenizer.decode(ids) == "MARK hi"
    default = load_engine(str(target), None, Mode.BASELINE, None, "cpu", "float32")
    assert default.tokenizer.decode(render_chat(default.tokenizer, [ChatMessage("user", "hi")], {})) != "MARK hi"


def test_the_labs_loading_hold_comes_through_the_arguments(tmp_path: Path) -> None:
    """The hook is read with the rest of the arguments, at the start; the load path only takes it from there."""
    assert parse_args(["--model-path", "/m"], environ={}).hold_loading_while == ""
    held = tmp_path / "hold"
    args = parse_args(["--model-path", "/m"], environ={HOLD_LOADING_ENV: f" {held} "})
    assert args.hold_loading_while == str(held) and str(held) not in str(args.public_dict())
