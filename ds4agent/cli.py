"""Command line: one parser for the agent (TUI, plain, headless) and the subcommands.

The parser; the typed settings built from what it parsed, here and nowhere else (the agent's
AgentRun, each subcommand's record of commands/settings.py), so that nothing past this module
reads the argparse namespace; and a table: subcommand name -> the module of ds4agent/commands/
whose `main(settings)` runs it and returns the exit code. Each is imported only when run, so `ds4agent --help` and the
subcommands that need no model start fast and never import MLX or Textual when they do not need
them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ds4agent.models.catalog import FLAVOURS
from ds4agent.models.errors import ModelError
from ds4agent.models.fit import DEFAULT_CTX
from ds4agent.models.locate import DEFAULT_MODEL_FILE

if TYPE_CHECKING:
    from ds4agent.agent.settings import AgentRun
    from ds4agent.commands.settings import CommandSettings

# subcommand -> its module in ds4agent/commands/; its main(settings) takes the command's settings
# (command_settings) and returns the exit code.
SUBCOMMANDS: dict[str, str] = {
    "tokens": "ds4agent.commands.tokens",
    "dump-logits": "ds4agent.commands.dump_logits",
    "make-test-model": "ds4agent.commands.make_test_model",
    "kv": "ds4agent.commands.kv",
    "info": "ds4agent.commands.info",
    "convert": "ds4agent.commands.convert",
    "pull": "ds4agent.commands.pull",
    "mcp": "ds4agent.commands.mcp",
    "verify": "ds4agent.commands.verify",
}


class UsageError(Exception):
    """A problem with what the user asked for; printed as one line, exit status 2."""


# The most context --ctx accepts: the model's own maximum (tokenizer model_max_length). A session
# file stores ctx in 32 bits, but anything past the model's maximum is a typo, not a wish, and
# would only fail later (or ask for terabytes of KV cache).
MAX_CTX = 1_048_576


def check_agent_flags(args: argparse.Namespace) -> None:
    """Range checks of the agent's numeric flags, before any model work: a bad value is a usage
    error now, not a "startup failed" or "context full" minutes later. argparse has already
    checked that each one is a number."""
    import math

    problems = []
    if not 1 <= args.ctx <= MAX_CTX:
        problems.append(f"--ctx must be between 1 and {MAX_CTX} tokens (got {args.ctx})")
    if args.round_tokens < 1:
        problems.append(f"--tokens must be at least 1 (got {args.round_tokens})")
    if not (math.isfinite(args.temp) and args.temp >= 0):
        problems.append(f"--temp must be a number >= 0 (got {args.temp})")
    if not (math.isfinite(args.top_p) and 0 < args.top_p <= 1):
        problems.append(f"--top-p must be greater than 0 and at most 1 (got {args.top_p})")
    if not (math.isfinite(args.min_p) and 0 <= args.min_p <= 1):
        problems.append(f"--min-p must be between 0 and 1 (got {args.min_p})")
    if not 1 <= args.power <= 100:
        problems.append(f"--power must be a whole number from 1 to 100 (got {args.power})")
    if args.prompt is not None and not args.prompt.strip():
        problems.append("-p needs a prompt (got an empty one)")
    if args.json_events and args.prompt is None:
        problems.append("--json needs -p PROMPT (it is the headless event stream)")
    if args.pipeline is not None and args.pipeline < 1:
        problems.append(f"--pipeline must be at least 1 process (got {args.pipeline})")
    if problems:
        raise UsageError(problems[0])


def _add_kv_dir(parser: argparse.ArgumentParser, default: object = None) -> None:
    parser.add_argument(
        "--kv-dir",
        metavar="DIR",
        default=default,
        help="session/KV cache directory (default: $DS4AGENT_KV_DIR, else ~/.ds4/kvcache)",
    )


MODEL_HELP = (f"model weights: a ds4 GGUF file or a converted MLX directory (default: $DS4AGENT_MODEL, "
              f"else ./{DEFAULT_MODEL_FILE}, else the model `ds4agent pull` fetched last)")


def _add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", "-m", metavar="PATH", default=None, help=MODEL_HELP)


def _add_subcommand_model(parser: argparse.ArgumentParser, *, positional: bool = False) -> None:
    """A subcommand takes the model as the agent does: `--model/-m` (SUPPRESS: `ds4agent --model X
    info` keeps the top-level value), and where a subcommand always had one, a positional MODEL as
    an alias of it. main() settles them into args.model; the subcommand resolves it with the one
    lookup (models.locate.resolve_model_path)."""
    parser.add_argument("--model", "-m", metavar="PATH", default=argparse.SUPPRESS, help=MODEL_HELP)
    if positional:
        parser.add_argument("model_arg", nargs="?", metavar="MODEL", default=None,
                            help="the same as --model")


def settle_model(args: argparse.Namespace) -> None:
    """args.model from a subcommand's positional MODEL or --model (given twice differently: a
    usage error, not a silent choice)."""
    given = getattr(args, "model_arg", None)
    if given is None:
        return
    if args.model is not None and args.model != given:
        raise UsageError(f"the model is given twice ({args.model} and {given}); give it once, with --model")
    args.model = given


def _add_device(parser: argparse.ArgumentParser, default: object = None) -> None:
    parser.add_argument("--device", choices=("cpu", "gpu"), default=default,
                        help="where the engine computes (default: the GPU when MLX has one: Metal on "
                        "Apple Silicon, CUDA with the cuda extra; else the CPU)")


def _add_pipeline(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--pipeline", type=int, metavar="N", default=None,
                       help="split the model's layers over N local processes (MLX ring backend on "
                       "127.0.0.1; for trying a pipeline on one machine)")
    where.add_argument("--hosts", metavar="FILE", default=None,
                       help="split the model over the machines of an mlx.launch hosts file, one rank "
                       "each (this machine is the first; the others are started over ssh)")
    parser.add_argument("--pipeline-split", metavar="L1[,L2..]", default=None, type=_split,
                        help="first layer of ranks 1.. (default: balanced by weight bytes)")


def _command(group: Any, name: str, text: str) -> argparse.ArgumentParser:
    """A subcommand's parser: its line in the parent's listing is also what its own --help says."""
    return group.add_parser(name, help=text, description=text)


def _add_mcp(parser: argparse.ArgumentParser, sub: Any) -> None:
    parser.add_argument("--no-mcp", action="store_true", dest="no_mcp",
                        help="start none of the MCP servers of mcp.json / .mcp.json")
    parser.add_argument("--no-subagents", action="store_true", dest="no_subagents",
                        help="no `task` tool: the model cannot start subagents (forks of the live KV "
                        "state that work on a task and return a summary)")
    p = _command(sub, "mcp", "the MCP servers of the user's mcp.json and the project's .mcp.json")
    q = _command(p.add_subparsers(dest="mcp_command", metavar="ACTION", required=True), "list",
                 "show each server, whether it starts, and its tools")
    q.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="how long to wait for each server to start (default: 30)")


def _split(text: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give the first layer of ranks 1.., "
                                         "comma-separated (e.g. 22)") from None


def _think_level(text: str) -> str:
    # The agent's mapping, through the command table (the CLI does not import the agent room).
    from ds4agent.ui.commands import think_mode_named

    try:
        return think_mode_named(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _interactive_help(columns: int) -> str:
    """The slash commands and keys, from the one table both front ends use (ds4agent/ui/commands.py
    is pure logic: importing it pulls in no Textual), wrapped to the terminal."""
    from ds4agent.ui.commands import help_text

    return "in the app and in --plain mode (/help, F1):\n" + help_text(columns)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ds4agent")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    import shutil
    import textwrap

    # The raw description and epilog keep their line breaks, so they are wrapped here, to the
    # width argparse wraps the flags to (the terminal's, or $COLUMNS).
    columns = shutil.get_terminal_size().columns
    parser = argparse.ArgumentParser(
        prog="ds4agent",
        # Written out: argparse's own usage lists a subcommand as `COMMAND ...`, as if one were
        # required, when the agent itself is what runs without one.
        usage="%(prog)s [OPTIONS]                 the agent (the app, --plain, -p TEXT)\n"
              "       %(prog)s [OPTIONS] COMMAND ...   a subcommand (listed below)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_interactive_help(columns),
        description=textwrap.fill(
            "A coding agent for DeepSeek V4 Flash with an in-process MLX engine and exact KV-cache "
            "sessions. Without a subcommand it starts the terminal app in the current directory.",
            max(40, columns - 2)),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    _add_model(parser)
    _add_kv_dir(parser)
    _add_device(parser)
    # Short aliases and defaults as in the reference ds4-agent (agent-reference.md §2).
    parser.add_argument("-c", "--ctx", type=int, default=DEFAULT_CTX, metavar="N",
                        help="context size in tokens (default: %(default)s)")
    parser.add_argument("-n", "--tokens", type=int, default=50_000, metavar="N", dest="round_tokens",
                        help="most tokens the model may generate in one assistant round, further "
                        "capped by the room left in the context (default: 50000)")
    think = parser.add_mutually_exclusive_group()
    think.add_argument("--think", dest="think_mode", action="store_const", const="think",
                       help="reasoning on (default)")
    think.add_argument("--nothink", dest="think_mode", action="store_const", const="nothink",
                       help="reasoning off")
    think.add_argument("--think-max", dest="think_mode", action="store_const", const="think-max",
                       help="maximum reasoning effort (needs a context of at least 393216 tokens; "
                       "falls back to --think below that)")
    think.add_argument("--think-level", dest="think_mode", type=_think_level, metavar="N",
                       help="thinking level: 0 off, 1 on (high effort), 2 maximum (the three "
                       "reasoning-effort forms of DeepSeek V4's template); /think N in the app")
    parser.set_defaults(think_mode="think")
    parser.add_argument("--temp", type=float, default=1.0, help="sampling temperature (default: 1.0)")
    parser.add_argument("--top-p", type=float, default=1.0, dest="top_p", help="top-p (default: 1.0)")
    parser.add_argument("--min-p", type=float, default=0.05, dest="min_p", help="min-p (default: 0.05)")
    parser.add_argument("--seed", type=int, default=None, help="sampler seed (default: random)")
    parser.add_argument("--power", type=int, default=100, metavar="N",
                        help="let the device compute at most N%% of the time (1-100), resting "
                        "between prefill chunks and tokens so a laptop stays cool; output is "
                        "unchanged (default: 100)")
    parser.add_argument("--permission", choices=("ask", "auto", "read-only", "plan"), default="ask",
                        help="ask before bash and file changes (default), run everything "
                        "without asking (auto), refuse bash and writes (read-only), or plan "
                        "first: read and propose, change nothing until you approve (plan; "
                        "/plan or Shift+Tab in the app); with -p and no terminal to ask on, ask "
                        "becomes read-only")
    parser.add_argument("--notify", choices=("auto", "bell", "osc", "off"), default=None,
                        help="ring the terminal when a long turn ends or a question waits: BEL "
                        "plus a desktop notification where the terminal shows one (auto, the "
                        "default), BEL only, OSC 9 always, or off; also notify.json in the "
                        "config directory")
    parser.add_argument("--notify-after", type=float, default=None, metavar="SECONDS", dest="notify_after",
                        help="ring when a turn ran at least this long (default: 30)")
    parser.add_argument("--edit-upto", action="store_true", dest="edit_upto",
                        help="let edits select a long span as HEAD[upto]TAIL (the agent writes "
                        "[upto] once the first lines are unique); default: exact old text only")
    parser.add_argument("-sys", "--system", metavar="TEXT", default=None,
                        help="extra system text appended to the built-in instructions")
    parser.add_argument("--trace", metavar="FILE", default=None,
                        help="write a timestamped token-level trace of the session to FILE")
    parser.add_argument("-p", "--prompt", metavar="TEXT", default=None,
                        help="run one task headless: the answer goes to stdout, tool activity to "
                        "stderr; the exit status tells whether it succeeded. Questions are asked on "
                        "the terminal; without one it runs read-only unless --permission auto. With "
                        "--resume ID or --continue, that session gets the task and is saved again")
    parser.add_argument("--json", action="store_true", dest="json_events",
                        help="with -p: write every agent event as one JSON line to stdout")
    reopen = parser.add_mutually_exclusive_group()
    # `-c` is --ctx (the reference's flag), so --continue has no short form.
    reopen.add_argument("--continue", action="store_true", dest="continue_session",
                        help="reopen the most recently saved session of this directory")
    reopen.add_argument("--resume", nargs="?", const="", default=None, metavar="PREFIX",
                        help="open the session with this id prefix (without one: the session picker)")
    parser.add_argument("--demo", action="store_true",
                        help="a guided tour without a model: a scripted engine reads, edits, runs a "
                        "command, tries a refused write and calls an MCP server in a scratch project, "
                        "with the real tools and permission questions")
    parser.add_argument("--plain", action="store_true",
                        help="line-mode interface (prompt_toolkit) instead of the full-screen app; "
                        "the default when stdout is not a terminal")
    _add_pipeline(parser)
    _add_subcommands(parser)
    return parser


def _add_subcommands(parser: argparse.ArgumentParser) -> None:
    """The subcommands' parsers (each one's `main` is in the SUBCOMMANDS module)."""
    # prog: each subcommand's usage reads `ds4agent kv ...`, not the written-out usage above.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", prog="ds4agent")
    _add_mcp(parser, sub)

    p = _command(sub, "tokens", "print the token ids and texts of a text (like ds4 --dump-tokens)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="text to tokenise")
    src.add_argument("--file", help="file whose contents to tokenise")
    p.add_argument("--plain-text", action="store_true",
                   help="tokenise as untrusted text (no special tokens at all); the default applies the "
                   "rendered-chat rules, recognising the seven protocol specials")

    p = _command(sub, "dump-logits", "write float32 logits [n_tokens, vocab] for a token list")
    _add_subcommand_model(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens", dest="token_list", help="comma-separated token ids")
    src.add_argument("--prompt-file", help="a file tokenised with the rendered-chat rules")
    p.add_argument("--chunk", type=int, default=None, help="prefill chunk size (default: one chunk)")
    p.add_argument("--ctx", type=int, default=None, help="context size (default: enough for the tokens)")
    p.add_argument("--out", required=True, help="output .npy file")
    _add_pipeline(p)

    p = _command(sub, "make-test-model", "write a DS4-architecture GGUF with random weights")
    p.add_argument("out", help="output .gguf path")
    p.add_argument("--config", default="tiny",
                   help="micro, tiny, small, or flash: the full DS4 Flash shape (default: tiny)")
    p.add_argument("--experts", choices=("q2", "q4", "mxfp4"), default=None,
                   help="routed-expert types: q2 (IQ2_XXS/Q2_K, the --config flash default) or q4 "
                        "(Q4_K), flash only; mxfp4 (ds4's native FP4 experts, MXFP4), any config")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default: 0)")

    p = _command(sub, "kv", "inspect the session/KV cache directory")
    # SUPPRESS: a subparser default would overwrite `ds4agent --kv-dir DIR kv ...` with None.
    _add_kv_dir(p, default=argparse.SUPPRESS)
    kv = p.add_subparsers(dest="kv_command", metavar="ACTION", required=True)
    q = _command(kv, "ls", "list sessions and caches, newest first (every model's, or one model's)")
    _add_kv_dir(q, default=argparse.SUPPRESS)  # `kv ls --kv-dir X` too: where people type it
    which = q.add_mutually_exclusive_group()
    which.add_argument("--model-id", type=int, default=None, metavar="N",
                       help="only the files of KVC model id N (0: DeepSeek V4 Flash, the model ds4agent runs)")
    which.add_argument("--all", action="store_true", help="the files of every model (the default)")
    q = _command(kv, "show", "show one file's header, title, text preview and payload")
    q.add_argument("target", metavar="FILE|PREFIX", help="a .kv file, or a session id prefix in the KV directory")
    _add_kv_dir(q, default=argparse.SUPPRESS)
    q = _command(kv, "verify", "validate every .kv file; non-zero exit when any is invalid")
    _add_kv_dir(q, default=argparse.SUPPRESS)
    q = _command(kv, "rm", "delete a session (readable or not) by id prefix")
    q.add_argument("prefix", metavar="PREFIX", help="the session's id, or enough of its start to name one")
    _add_kv_dir(q, default=argparse.SUPPRESS)

    p = _command(sub, "info", "print a model's shape, quant types, sizes and memory estimate")
    _add_subcommand_model(p, positional=True)
    p.add_argument("--ctx", type=int, default=DEFAULT_CTX, help="context for the KV estimate (default: %(default)s)")
    _add_device(p, default=argparse.SUPPRESS)  # SUPPRESS: keep `ds4agent --device X info ...`
    p.add_argument("--pipeline", type=int, metavar="N", default=None,
                   help="also print the memory each of N pipeline ranks needs")
    p.add_argument("--pipeline-split", metavar="L1[,L2..]", default=None, type=_split,
                   help="first layer of ranks 1.. (default: balanced by weight bytes)")

    p = _command(sub, "convert", "convert the official DeepSeek-V4-Flash safetensors to an MLX directory")
    p.add_argument("source", help="directory of the official checkpoint (safetensors)")
    p.add_argument("out", help="output directory")

    p = _command(sub, "verify", "check a model against recorded greedy continuations (ds4's test vectors)")
    _add_subcommand_model(p, positional=True)
    p.add_argument("--vectors", metavar="DIR", required=True,
                   help="vector directory: manifest.json, prompts/*.txt, official/*.official.json")
    p.add_argument("--ctx", type=int, default=None, help="context size (default: enough for the longest case)")

    p = _command(sub, "pull", "download a model from the Hugging Face Hub (no NAME: list them)")
    p.add_argument("name", nargs="?", metavar="NAME", choices=[f.name for f in FLAVOURS],
                   help="one of: " + ", ".join(f.name for f in FLAVOURS))
    p.add_argument("--dir", metavar="DIR", default=None,
                   help="where models are kept (default: $DS4AGENT_MODEL_DIR, else ~/.ds4/models)")
    p.add_argument("--token", metavar="TOKEN", default=None,
                   help="Hugging Face token (default: $HF_TOKEN, else the one `hf auth login` saved)")
    p.add_argument("--yes", action="store_true",
                   help="download even a model this machine does not have the memory to run")


def _split_tuple(split: list[int] | None) -> tuple[int, ...] | None:
    return tuple(split) if split is not None else None


def agent_run(args: argparse.Namespace) -> AgentRun:
    """The agent's run from the parsed command line (no subcommand): its knobs, model, engine
    placement and front end. The flags' defaults are the parser's; the values are checked by
    check_agent_flags."""
    from ds4agent.agent.settings import AgentRun, AgentSettings, EnginePlacement

    settings = AgentSettings(
        ctx=args.ctx,
        round_tokens=args.round_tokens,
        think_mode=args.think_mode,
        temperature=args.temp,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
        permission=args.permission,
        edit_upto=args.edit_upto,
        power=args.power,
        system=args.system,
        trace=Path(args.trace) if args.trace else None,
        cwd=Path(os.getcwd()),
        kv_dir=Path(args.kv_dir).expanduser() if args.kv_dir else None,
        continue_session=args.continue_session,
        subagents=not args.no_subagents,
        resume=args.resume,
    )
    return AgentRun(
        settings=settings,
        model=args.model,
        placement=EnginePlacement(device=args.device, ranks=args.pipeline, hosts=args.hosts,
                                  split=_split_tuple(args.pipeline_split)),
        demo=args.demo,
        mcp=not args.no_mcp,
        plain=args.plain,
        prompt=args.prompt,
        json_events=args.json_events,
        notify=args.notify,
        notify_after=args.notify_after,
    )


def command_settings(args: argparse.Namespace) -> CommandSettings:
    """A subcommand's settings (commands/settings.py) from the parsed command line. A flag that
    only some actions take (kv's, mcp's) is absent from the namespace of the others."""
    from ds4agent.commands import settings as cs

    settle_model(args)
    name = args.command
    if name == "tokens":
        return cs.TokensSettings(text=args.text, file=args.file, plain_text=args.plain_text)
    if name == "dump-logits":
        return cs.DumpLogitsSettings(model=args.model, token_list=args.token_list, prompt_file=args.prompt_file,
                                     chunk=args.chunk, ctx=args.ctx, out=args.out, ranks=args.pipeline,
                                     hosts=args.hosts, split=_split_tuple(args.pipeline_split))
    if name == "make-test-model":
        return cs.MakeTestModelSettings(out=args.out, config=args.config, experts=args.experts, seed=args.seed)
    if name == "kv":
        every = getattr(args, "all", False)
        return cs.KvSettings(action=args.kv_command, kv_dir=args.kv_dir, target=getattr(args, "target", None),
                             prefix=getattr(args, "prefix", None),
                             model_id=None if every else getattr(args, "model_id", None))
    if name == "info":
        return cs.InfoSettings(model=args.model, ctx=args.ctx, device=args.device, ranks=args.pipeline,
                               split=_split_tuple(args.pipeline_split))
    if name == "convert":
        return cs.ConvertSettings(source=args.source, out=args.out)
    if name == "verify":
        return cs.VerifySettings(model=args.model, vectors=args.vectors, ctx=args.ctx)
    if name == "pull":
        return cs.PullSettings(name=args.name, directory=args.dir, token=args.token, yes=args.yes)
    if name == "mcp":
        return cs.McpSettings(action=args.mcp_command, timeout=args.timeout)
    raise UsageError(f"unknown command: {name}")


def settings_from(args: argparse.Namespace) -> AgentRun | CommandSettings:
    """What the parsed command line asks for, typed: the subcommand's settings, else the agent's
    run (its flags checked first). UsageError for what argparse cannot check."""
    if args.command is not None:
        return command_settings(args)
    check_agent_flags(args)
    return agent_run(args)


def parse(argv: Sequence[str] | None = None) -> AgentRun | CommandSettings:
    """settings_from for a list of words (the tests' way in; main() runs the same steps)."""
    return settings_from(build_parser().parse_args(argv))


def _call(module: str, settings: AgentRun | CommandSettings) -> int:
    return int(importlib.import_module(module).main(settings) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from(args)
        return _call(SUBCOMMANDS[args.command] if args.command is not None else "ds4agent.commands.agent", settings)
    except (UsageError, ModelError) as err:
        print(f"ds4agent: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`ds4agent … | head`): stop quietly like any Unix
        # filter. Point stdout at /dev/null so the interpreter's final flush cannot raise again.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout without a file descriptor (embedded, tests)
            pass
        return 141


def _forget_working_directory_imports() -> None:
    """Drop the working directory from the import path (`python -m` puts it first). The package is
    loaded by now and finds its own modules through its __path__; left there, a file a job writes
    in the tree (`subprocess.py`, `numpy.py`) would be imported, unconfined, by the agent's next
    lazy import of that name."""
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".") and os.path.abspath(p) != cwd]


def entry() -> None:
    """The process entry point (console script and `python -m ds4agent.cli`).

    Runs main(), then leaves with os._exit once Python's own exit handlers have run and the
    standard streams are flushed. Why: MLX gives every thread that ran an MLX op (the agent's
    worker) a C++ stream thread, and tearing those down in C++ static destructors at interpreter
    exit races and sometimes ends in std::terminate ("terminate called without an active
    exception", exit 134) after all our work succeeded (measured here: about 1 run in 20 of a
    plain MLX worker thread; 0 in 60 with this exit). Everything we write is already fsynced by
    then (sessions, journal, history), so skipping the C++ destructors loses nothing.
    """
    import atexit

    _forget_working_directory_imports()
    code = main()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed pipe or closed stream: nothing left to deliver
            pass
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
