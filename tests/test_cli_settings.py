"""The command line is read once: cli.py turns the parsed namespace into typed, frozen settings
(the agent's AgentRun, each subcommand's record of commands/settings.py) and passes those on.
These tests hold the conversion to the flags' meaning, and the rest of the package to never
touching an argparse namespace (read from the source with `ast`)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from ds4agent import cli
from ds4agent.agent.settings import AgentRun, AgentSettings, EnginePlacement
from ds4agent.commands import settings as cs

PACKAGE = Path(__file__).resolve().parent.parent / "ds4agent"
# The pipeline's rank process (python -m ds4agent.engine.pipeline.worker) has a command line of
# its own, parsed and read inside its main().
OWN_PARSERS = {"cli.py", "engine/pipeline/worker.py"}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(p.relative_to(PACKAGE).as_posix(), ast.parse(p.read_text(), str(p)))
            for p in sorted(PACKAGE.rglob("*.py"))]


def _namespace_uses(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "args"):
            found.append(f"line {node.lineno}: getattr(args, ...)")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
                note = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                if "Namespace" in note and "SimpleNamespace" not in note:
                    found.append(f"line {node.lineno}: {node.name}({arg.arg}: {note})")
                if arg.arg == "args" and node.name == "main" and note in ("", "Any", "object"):
                    found.append(f"line {node.lineno}: main(args) takes an untyped namespace")
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if "argparse" in names:
                found.append(f"line {node.lineno}: imports argparse")
    return found


def test_no_module_but_cli_touches_an_argparse_namespace():
    offenders = {name: uses for name, tree in _modules() if name not in OWN_PARSERS
                 for uses in [_namespace_uses(tree)] if uses}
    assert offenders == {}


def test_the_check_sees_each_way_of_passing_a_namespace_on():
    tree = ast.parse("import argparse\n"
                     "def main(args): return getattr(args, 'x', None)\n"
                     "def f(ns: argparse.Namespace) -> None: ...\n")
    assert sorted(_namespace_uses(tree)) == ["line 1: imports argparse", "line 2: getattr(args, ...)",
                                             "line 2: main(args) takes an untyped namespace",
                                             "line 3: f(ns: argparse.Namespace)"]


def test_the_agent_run_carries_every_flag(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = cli.parse(["-m", "m.gguf", "--kv-dir", "~/kv", "--device", "cpu", "-c", "4096", "-n", "7",
                     "--think-max", "--temp", "0.5", "--top-p", "0.9", "--min-p", "0.1", "--seed", "3",
                     "--power", "40", "--permission", "auto", "--notify", "off", "--notify-after", "5",
                     "--edit-upto", "-sys", "be brief", "--trace", "t.txt", "-p", "task", "--json",
                     "--resume", "ab12", "--plain", "--pipeline", "2", "--pipeline-split", "3",
                     "--no-mcp", "--no-subagents"])
    assert run == AgentRun(
        settings=AgentSettings(ctx=4096, round_tokens=7, think_mode="think-max", temperature=0.5, top_p=0.9,
                               min_p=0.1, seed=3, permission="auto", edit_upto=True, power=40,
                               system="be brief", trace=Path("t.txt"), cwd=tmp_path,
                               kv_dir=Path("~/kv").expanduser(), subagents=False, resume="ab12"),
        model="m.gguf", placement=EnginePlacement(device="cpu", ranks=2, split=(3,)), mcp=False,
        plain=True, prompt="task", json_events=True, notify="off", notify_after=5.0)


def test_the_agent_runs_defaults_are_the_parsers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = cli.parse([])
    assert run == AgentRun(settings=AgentSettings(cwd=tmp_path, subagents=True))
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.demo = True  # type: ignore[misc]
    fresh = run.fresh_settings()
    fresh.permission = "auto"  # an agent's own copy: the run stays as the command line asked
    assert run.settings.permission == "ask" and fresh is not run.settings
    assert cli.parse(["--continue", "--demo", "--hosts", "h.json"]) == AgentRun(
        settings=AgentSettings(cwd=tmp_path, subagents=True, continue_session=True), demo=True,
        placement=EnginePlacement(hosts="h.json"))


@pytest.mark.parametrize(("argv", "expected"), [
    (["tokens", "--text", "a", "--plain-text"], cs.TokensSettings(text="a", file=None, plain_text=True)),
    (["dump-logits", "-m", "M", "--tokens", "1,2", "--chunk", "4", "--out", "o.npy", "--pipeline", "2",
      "--pipeline-split", "5"],
     cs.DumpLogitsSettings(model="M", token_list="1,2", prompt_file=None, chunk=4, ctx=None, out="o.npy",
                           ranks=2, hosts=None, split=(5,))),
    (["make-test-model", "x.gguf", "--config", "micro", "--experts", "mxfp4", "--seed", "2"],
     cs.MakeTestModelSettings(out="x.gguf", config="micro", experts="mxfp4", seed=2)),
    (["--kv-dir", "D", "kv", "ls", "--model-id", "0"], cs.KvSettings(action="ls", kv_dir="D", model_id=0)),
    (["kv", "ls", "--all", "--kv-dir", "D"], cs.KvSettings(action="ls", kv_dir="D")),
    (["kv", "show", "ab"], cs.KvSettings(action="show", kv_dir=None, target="ab")),
    (["kv", "rm", "ab", "--kv-dir", "D"], cs.KvSettings(action="rm", kv_dir="D", prefix="ab")),
    (["--device", "gpu", "info", "M", "--ctx", "8", "--pipeline", "3"],
     cs.InfoSettings(model="M", ctx=8, device="gpu", ranks=3, split=None)),
    (["convert", "src", "out"], cs.ConvertSettings(source="src", out="out")),
    (["verify", "--vectors", "V", "-m", "M"], cs.VerifySettings(model="M", vectors="V", ctx=None)),
    (["pull", "q2-imatrix", "--dir", "d", "--yes"],
     cs.PullSettings(name="q2-imatrix", directory="d", token=None, yes=True)),
    (["mcp", "list", "--timeout", "2"], cs.McpSettings(action="list", timeout=2.0)),
])
def test_each_subcommand_gets_its_typed_settings(argv, expected):
    assert cli.parse(argv) == expected


def test_every_subcommand_has_its_settings():
    made = {type(cli.parse(argv)).__name__ for argv in (
        ["tokens", "--text", "a"], ["dump-logits", "--tokens", "1", "--out", "o"], ["make-test-model", "o"],
        ["kv", "verify"], ["info"], ["convert", "a", "b"], ["verify", "--vectors", "V"], ["pull"],
        ["mcp", "list"])}
    assert len(made) == len(cli.SUBCOMMANDS)


def test_a_bad_agent_flag_is_a_usage_error_before_any_settings():
    with pytest.raises(cli.UsageError, match="--power must be a whole number from 1 to 100"):
        cli.parse(["--power", "0"])
