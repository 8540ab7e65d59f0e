"""The subcommands' settings: one frozen, typed record per `ds4agent COMMAND`, built once by
ds4agent/cli.py from what argparse parsed (its parser holds the flags' help and defaults) and
handed to that command's `main`. Nothing past cli.py reads the argparse namespace."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokensSettings:
    """`ds4agent tokens`: exactly one of text and file (the parser sees to it)."""

    text: str | None
    file: str | None
    plain_text: bool  # --plain-text: untrusted text, no special tokens


@dataclass(frozen=True)
class DumpLogitsSettings:
    """`ds4agent dump-logits`: exactly one of token_list and prompt_file."""

    model: str | None  # --model/-m (None: the usual lookup)
    token_list: str | None  # --tokens: comma-separated ids
    prompt_file: str | None
    chunk: int | None  # prefill chunk size (None: one chunk)
    ctx: int | None  # None: enough for the tokens
    out: str  # the .npy file
    ranks: int | None  # --pipeline N
    hosts: str | None  # --hosts FILE
    split: tuple[int, ...] | None  # --pipeline-split


@dataclass(frozen=True)
class MakeTestModelSettings:
    out: str
    config: str  # micro, tiny, small or flash
    experts: str | None  # q2, q4, mxfp4 (None: the config's own)
    seed: int


@dataclass(frozen=True)
class KvSettings:
    """`ds4agent kv ACTION`: target goes with show, prefix with rm, model_id with ls."""

    action: str  # ls, show, verify, rm
    kv_dir: str | None  # --kv-dir (None: $DS4AGENT_KV_DIR, else ~/.ds4/kvcache)
    target: str | None = None  # show: a .kv file or a session id prefix
    prefix: str | None = None  # rm: a session id prefix
    model_id: int | None = None  # ls: only this KVC model id's files (None: every model's)


@dataclass(frozen=True)
class InfoSettings:
    model: str | None
    ctx: int  # the context of the KV estimate
    device: str | None  # None: the GPU when MLX has one
    ranks: int | None  # --pipeline N: also each rank's memory
    split: tuple[int, ...] | None  # --pipeline-split


@dataclass(frozen=True)
class ConvertSettings:
    source: str  # the official checkpoint's directory
    out: str  # the MLX directory to write


@dataclass(frozen=True)
class VerifySettings:
    model: str | None
    vectors: str  # the vector directory
    ctx: int | None  # None: enough for the longest case


@dataclass(frozen=True)
class PullSettings:
    name: str | None  # a flavour of models.catalog (None: list them)
    directory: str | None  # --dir (None: $DS4AGENT_MODEL_DIR, else ~/.ds4/models)
    token: str | None  # --token (None: $HF_TOKEN, else the saved one)
    yes: bool  # download even what this machine lacks the memory to run


@dataclass(frozen=True)
class McpSettings:
    action: str  # list
    timeout: float  # seconds to wait for each server to start


# What cli.command_settings builds: one of the records above.
CommandSettings = (TokensSettings | DumpLogitsSettings | MakeTestModelSettings | KvSettings | InfoSettings
                   | ConvertSettings | VerifySettings | PullSettings | McpSettings)
