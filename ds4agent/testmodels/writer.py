"""make_test_model: a DS4-architecture GGUF with deterministic random weights.

`make_test_model(path, config="tiny", seed=0)` writes the real `deepseek4.*` metadata keys and
the real tensor names/types/dims of model.md §6.3 (engine/layout.py's table) for a named test
config (engine/config.py), through the `gguf` package's writer, so the file takes exactly the
path a real ds4 GGUF takes through the engine's GGUF reader and weight loader. F16 routed experts
and the test-model marker (TEST_MODEL_KEY): the engine checks such a file's metadata permissively.
`ds4agent make-test-model OUT.gguf [--config NAME] [--seed N]` is the command-line face.

With `experts="q2"` or `"q4"` (and always for `config="flash"`) the file is instead a
Flash-layout file with ds4's quantised types and tokenizer and no test-model marker, written by
flash.py (`ds4agent make-test-model OUT --config flash [--experts q2|q4|mxfp4]`). With
`experts="mxfp4"` and a test config, the file is the F16-expert file with the same drawn
values stored as MXFP4 routed experts (ggml type 39: ds4's native FP4 experts), marker kept.

The values and their encoding are values.py's; random_weights.py builds the same numbers in
memory without a file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ds4agent.engine.config import TEST_CONFIGS, TEST_MODEL_KEY, ModelConfig, flash_config, test_config
from ds4agent.engine.errors import ConfigError, EngineError
from ds4agent.engine.layout import ARCH, tensor_table
from ds4agent.fsutil import atomic_path

from .flash import write_flash_model
from .values import add_config_metadata, encode, random_values


def named_config(name: str) -> ModelConfig:
    """A config make-test-model accepts by name: 'flash' or a named test config."""
    if name == "flash":
        return flash_config()
    try:
        return test_config(name)
    except ConfigError:
        names = ", ".join(sorted(("flash", *TEST_CONFIGS)))
        raise ConfigError(f"unknown test config {name!r} (choose from {names})") from None


def make_test_model(path: str | os.PathLike[str], config: str | ModelConfig = "tiny",
                    seed: int = 0, experts: str | None = None) -> Path:
    """Write a DS4-architecture GGUF with deterministic random weights; returns the path.

    experts: None writes F16 routed experts and the test-model marker (the engine then checks the
    metadata permissively); "mxfp4" the same with MXFP4 routed experts; "q2" / "q4" (and
    "mxfp4" for the Flash config) writes ds4's quantised layout without the marker (flash.py),
    which the Flash config always gets (F16 experts would take 86 GB).
    The same arguments always give the same bytes. Written atomically (ds4agent.fsutil), so a
    failed write never leaves a half file under `path` and keeps the file that was there.
    """
    from gguf import GGMLQuantizationType, GGUFWriter

    cfg = named_config(config) if isinstance(config, str) else config
    if not isinstance(seed, int) or seed < 0:
        raise EngineError(f"--seed must be a non-negative integer (got {seed})")
    if experts is None and cfg == flash_config():
        experts = "q2"
    if experts is not None and (experts != "mxfp4" or cfg == flash_config()):
        return write_flash_model(path, cfg, experts=experts, seed=seed)
    path = Path(path)
    rng = np.random.default_rng(seed)
    # The gguf writer opens its file by name: fsutil's atomic_path gives it a temp path beside
    # the target and renames it over `path` only once the whole file is written.
    with atomic_path(path, make_parents=True) as tmp:
        writer = GGUFWriter(tmp, ARCH)
        try:
            writer.add_name(f"ds4agent test model ({cfg.name or 'custom'}, seed {seed})")
            writer.add_bool(TEST_MODEL_KEY, True)
            add_config_metadata(writer, cfg)
            for spec in tensor_table(cfg, experts):  # refuses an unknown flavour
                data = encode(spec, random_values(spec, cfg, rng))
                if spec.ggml_type in ("Q8_0", "MXFP4"):
                    writer.add_tensor(spec.name, data, raw_shape=data.shape,
                                      raw_dtype=GGMLQuantizationType[spec.ggml_type])
                else:
                    writer.add_tensor(spec.name, data)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    return path
