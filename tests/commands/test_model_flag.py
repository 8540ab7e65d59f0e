"""One rule for the model in every subcommand: `--model/-m` (a positional MODEL kept as an alias
where one existed), the agent's lookup when none is given ($DS4AGENT_MODEL first), and the
top-level `ds4agent --model X SUBCOMMAND` honoured."""

from __future__ import annotations

import pytest

from ds4agent import cli
from ds4agent.commands.settings import DumpLogitsSettings, InfoSettings, VerifySettings
from ds4agent.testmodels import make_test_model


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    return str(make_test_model(tmp_path_factory.mktemp("flag") / "micro.gguf", "micro", seed=3))


def _settled(argv: list[str]) -> str | None:
    settings = cli.parse(argv)
    assert isinstance(settings, InfoSettings | VerifySettings | DumpLogitsSettings)
    return settings.model


@pytest.mark.parametrize("argv", [
    ["info", "M"], ["info", "--model", "M"], ["info", "-m", "M"], ["--model", "M", "info"],
    ["verify", "M", "--vectors", "V"], ["verify", "-m", "M", "--vectors", "V"],
    ["--model", "M", "verify", "--vectors", "V"],
    ["dump-logits", "-m", "M", "--tokens", "1", "--out", "o.npy"],
    ["-m", "M", "dump-logits", "--tokens", "1", "--out", "o.npy"],
])
def test_every_way_of_naming_the_model_is_the_same(argv):
    assert _settled(argv) == "M"


def test_no_model_given_leaves_the_lookup_to_the_subcommand():
    assert _settled(["info"]) is None
    assert _settled(["verify", "--vectors", "V"]) is None


def test_the_model_given_twice_differently_is_a_usage_error(capsys):
    assert cli.main(["info", "A.gguf", "--model", "B.gguf"]) == 2
    assert "the model is given twice" in capsys.readouterr().err


def test_info_without_a_model_uses_DS4AGENT_MODEL(micro, monkeypatch, capsys):
    monkeypatch.setenv("DS4AGENT_MODEL", micro)
    assert cli.main(["info"]) == 0
    assert micro in capsys.readouterr().out


def test_info_of_a_missing_model_says_so(tmp_path, capsys):
    assert cli.main(["info", "--model", str(tmp_path / "none.gguf")]) == 2
    err = capsys.readouterr().err
    assert "no model found at" in err and "Traceback" not in err


def test_the_top_level_model_reaches_info(micro, capsys, monkeypatch):
    monkeypatch.delenv("DS4AGENT_MODEL", raising=False)
    assert cli.main(["--model", micro, "info"]) == 0
    assert micro in capsys.readouterr().out
