"""ModelConfig from deepseek4.* metadata: strict Flash mode, permissive test mode, named configs."""

from __future__ import annotations

import pytest

from ds4agent.engine import ConfigError
from ds4agent.engine.config import (
    PREFIX,
    TEST_CONFIGS,
    flash_config,
    from_metadata,
    test_config,
)


def test_flash_metadata_round_trips_and_derived_values():
    cfg = flash_config()
    got = from_metadata(cfg.to_metadata())
    assert got == cfg
    assert got.ratios[:5] == (0, 0, 4, 128, 4) and got.ratios[42] == 4 and len(got.ratios) == 43
    assert got.yarn_lo_hi() == (15, 25)
    assert got.nope_dim == 448 and got.hc_mix == 24 and got.coff(2) == 2 and got.coff(3) == 1


@pytest.mark.parametrize(("key", "value"), [
    ("block_count", 42), ("embedding_length", 4095), ("vocab_size", 129281),
    ("attention.sliding_window", 64), ("attention.indexer.top_k", 256),
    ("hyper_connection.epsilon", 1e-5), ("rope.scaling.factor", 8.0),
    ("attention.compress_rope_freq_base", 10000.0), ("expert_weights_scale", 1.0),
])
def test_flash_mode_names_the_mismatching_key(key, value):
    meta = flash_config().to_metadata()
    meta[PREFIX + key] = value
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        from_metadata(meta)


def test_flash_mode_checks_ratios_elementwise_and_types():
    meta = flash_config().to_metadata()
    ratios = list(meta[PREFIX + "attention.compress_ratios"])
    ratios[7] = 4
    meta[PREFIX + "attention.compress_ratios"] = ratios
    with pytest.raises(ConfigError, match=r"compress_ratios\[7\] is 4, expected 128"):
        from_metadata(meta)
    meta = flash_config().to_metadata()
    with pytest.raises(ConfigError, match="block_count.*type FLOAT32"):
        from_metadata(meta, types={PREFIX + "block_count": "FLOAT32"})
    del meta[PREFIX + "attention.head_count"]
    with pytest.raises(ConfigError, match="missing the key 'deepseek4.attention.head_count'"):
        from_metadata(meta)


def test_first_mismatch_in_table_order_is_reported():
    meta = flash_config().to_metadata()
    meta[PREFIX + "expert_weights_scale"] = 2.0
    meta[PREFIX + "attention.head_count"] = 32
    with pytest.raises(ConfigError, match="head_count is 32"):
        from_metadata(meta)


@pytest.mark.parametrize("name", sorted(TEST_CONFIGS))
def test_named_test_configs_validate_and_round_trip_in_test_mode(name):
    cfg = test_config(name)
    assert from_metadata(cfg.to_metadata(), mode="test") == cfg
    with pytest.raises(ConfigError, match="not a DS4 Flash model"):
        from_metadata(cfg.to_metadata(), mode="flash")
    assert 4 in cfg.ratios and max(cfg.ratios) > 4
    if name in ("tiny", "small"):
        assert cfg.vocab == 129280
    if name in ("micro", "tiny"):  # pruning starts within ~100 tokens
        assert 4 * (cfg.indexer_top_k + 1) - 1 < 100


@pytest.mark.parametrize(("key", "value", "msg"), [
    ("attention.key_length", 100, "multiple of 64"),
    ("attention.indexer.key_length", 48, "power of two"),
    ("expert_shared_count", 2, "must be 1"),
    ("expert_weights_norm", False, "must be true"),
    ("attention.output_group_count", 3, "must divide"),
    ("expert_group_count", 4, "group-limited"),
])
def test_test_mode_refuses_unsupported_shapes(key, value, msg):
    meta = test_config("micro").to_metadata()
    meta[PREFIX + key] = value
    if key == "attention.key_length":
        meta[PREFIX + "attention.value_length"] = value
    with pytest.raises(ConfigError, match=msg):
        from_metadata(meta, mode="test")
