"""AgentSettings: the knobs the command line gives the agent (shared by TUI, plain and headless);
AgentRun: one run of the agent as the command line asks for it (ds4agent/cli.py builds it)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ds4agent.models.fit import DEFAULT_CTX

THINK_MODES = ("think", "nothink", "think-max")
# The thinking levels /think N and --think-level N name: DeepSeek V4's template has exactly three
# reasoning-effort forms (prompt-and-dsml.md §4): none (</think> opens the answer), high (<think>)
# and max (<think> plus the Think-Max prefix). ds4-server maps low/medium/high/xhigh all to high.
THINK_LEVELS = ("nothink", "think", "think-max")
PERMISSION_MODES = ("ask", "auto", "read-only", "plan")


@dataclass
class AgentSettings:
    ctx: int = DEFAULT_CTX
    round_tokens: int = 50_000  # --tokens: most tokens sampled in one round (further capped by room)
    think_mode: str = "think"
    temperature: float = 1.0
    top_p: float = 1.0
    min_p: float = 0.05
    seed: int | None = None  # re-seeded at every user turn when set (agent-reference.md §2)
    permission: str = "ask"
    # --edit-upto: the edit tool also takes old as HEAD[upto]TAIL (and the agent writes [upto]
    # itself once the streamed old is unique); off, old is exact text only.
    edit_upto: bool = False
    power: int = 100  # --power / /power: the device computes at most this percent of the time
    system: str | None = None  # extra system text (--system), untrusted, trimmed
    trace: Path | None = None  # --trace FILE
    cwd: Path = field(default_factory=Path.cwd)
    kv_dir: Path | None = None  # None: the store's default resolution
    journal_dir: Path | None = None  # None: platformdirs user state dir
    use_sysprompt_cache: bool = True
    journal: bool = True
    # During a long round the journal is also rewritten at most this often (seconds), so a crash
    # loses at most this much generation (a round may run for many minutes at tens of tok/s).
    journal_interval: float = 10.0
    # Memory the rewind snapshots may hold (engine/snapshots.py); past it the middle ones go.
    snapshot_budget: int = 2 << 30
    undo_dir: Path | None = None  # undo log; None: platformdirs user state dir
    # The user's ds4agent config directory (custom commands, skills, hooks); None: the platform's
    # (tools/userdirs.default_config_dir).
    config_dir: Path | None = None
    # The `task` tool (subagents forked from the live KV state). Off in a bare AgentSettings, so
    # a test's tools block is what it states; the command line turns it on (--no-subagents: off).
    subagents: bool = False
    # Reopen a saved session at start: --continue (this directory's newest), --resume PREFIX.
    # resume == "" means "let me choose": the front end opens its picker.
    continue_session: bool = False
    resume: str | None = None
    # The model this run loads (recorded with each save, for --resume and the fingerprint check).
    model_path: str = ""
    model_fingerprint: str = ""

    def user_config_dir(self) -> Path:
        from ds4agent.tools.userdirs import default_config_dir

        return self.config_dir if self.config_dir is not None else default_config_dir()

    def effective_think_mode(self) -> str:
        """think-max silently becomes think below 384K of context: the renderer's own rule
        (template.effective_think_mode), so the status shows the mode the system prefix has."""
        from ds4agent.protocol.template import effective_think_mode

        return str(effective_think_mode(self.think_mode, self.ctx))

    @property
    def think_level(self) -> int:
        """The requested mode as its level (0 nothink, 1 think, 2 think-max)."""
        return THINK_LEVELS.index(self.think_mode)


@dataclass(frozen=True)
class EnginePlacement:
    """Where the engine computes: --device (None: the GPU when there is one), and a pipeline over
    `ranks` local processes (--pipeline) or the machines of a hosts file (--hosts), split at the
    first layers of ranks 1.. (--pipeline-split; None: balanced by weight bytes)."""

    device: str | None = None
    ranks: int | None = None
    hosts: str | None = None
    split: tuple[int, ...] | None = None


@dataclass(frozen=True)
class AgentRun:
    """One run of the agent as the command line asks for it, built once by ds4agent/cli.py and
    passed on as it is: the agent's knobs, the model and where the engine computes, and the front
    end with its signals. `settings` is the starting point; each Agent built from the run gets its
    own copy (fresh_settings), since an agent's knobs change while it runs (/think, /power)."""

    settings: AgentSettings = field(default_factory=AgentSettings)
    model: str | None = None  # --model as given (None: $DS4AGENT_MODEL, a resumed session's, the lookup)
    # The model file the run loads, resolved once by commands/agent.py (None: the demo, no model).
    model_path: Path | None = None
    placement: EnginePlacement = EnginePlacement()
    demo: bool = False  # --demo: the scripted tour, no model
    mcp: bool = True  # --no-mcp: start none of the configured MCP servers
    plain: bool = False  # --plain: the line-mode front end
    prompt: str | None = None  # -p TEXT: one task, headless
    json_events: bool = False  # --json: with -p, every event as a JSON line
    notify: str | None = None  # --notify (None: notify.json's, else auto)
    notify_after: float | None = None  # --notify-after SECONDS (None: notify.json's, else 30)

    def fresh_settings(self) -> AgentSettings:
        """A copy of the run's settings for one agent to change as it runs."""
        return replace(self.settings)


def think_mode_named(word: str) -> str:
    """The think mode a /think argument or --think-level value names: a level 0-2 or a mode name;
    ValueError (readable) for anything else."""
    word = word.strip().lower()
    if word.isdigit() and int(word) < len(THINK_LEVELS):
        return THINK_LEVELS[int(word)]
    if word in THINK_MODES:
        return word
    raise ValueError(f"unknown thinking level: {word!r} (0 nothink, 1 think, 2 think-max; "
                     "DeepSeek V4 has these three reasoning-effort forms)")
