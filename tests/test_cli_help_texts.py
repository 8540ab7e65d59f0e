"""--help as a newcomer reads it: the usage does not make a subcommand look required, and every
subcommand's own --help says what it does and what its arguments are."""

from __future__ import annotations

import pytest

from ds4agent.cli import build_parser


def test_the_usage_shows_the_agent_runs_without_a_subcommand():
    usage = build_parser().format_usage()
    assert usage.startswith("usage: ds4agent [OPTIONS]") and "COMMAND ...   a subcommand" in usage


@pytest.mark.parametrize("argv, words", [
    (["info"], ["print a model's shape", "MODEL", "the same as --model"]),
    (["kv", "rm"], ["delete a session", "PREFIX", "enough of its start"]),
    (["kv", "show"], ["show one file's header", "FILE|PREFIX", "a .kv file"]),
    (["mcp", "list"], ["show each server"]),
])
def test_every_subcommand_help_says_what_it_does(argv, words, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    out = capsys.readouterr().out
    assert out.startswith(f"usage: ds4agent {' '.join(argv)} ")
    for word in words:
        assert word in out


def test_info_says_where_test_model_experts_live(tmp_path, capsys):
    from ds4agent import cli
    from ds4agent.testmodels import make_test_model

    model = make_test_model(tmp_path / "micro.gguf", "micro", seed=1)
    assert cli.main(["info", str(model)]) == 0
    out = capsys.readouterr().out
    assert "routed experts 0 B" not in out
    assert "held with the weights above (their type is not memory-mapped)" in out
