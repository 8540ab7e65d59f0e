"""bench/device_bytes.py: the modeled device bytes of a decoded token at the Flash shape (shapes
only, nothing loaded)."""

from __future__ import annotations

from bench import device_bytes
from ds4agent.engine import quant
from ds4agent.engine.config import flash_config
from ds4agent.engine.experts import gpu


def test_expert_kernel_reads_each_selected_block_once():
    # decode, k = 6, at the Flash gate shape: the blocks of the 6 experts, their inputs, the outputs
    kern, portable, selected = device_bytes.expert_reads("IQ2_XXS", 2048, 4096, 6)
    assert selected == 6 * 2048 * 4096 // 256 * 66
    assert kern == gpu.read_bytes(quant.IQ2_XXS, 4096, 2048, 6) == selected + 6 * 4096 * 4 + 6 * 2048 * 4
    assert portable > 30 * selected  # dequantised to f32 (written and read): the path the kernels replace


def test_every_flavour_is_within_the_target_and_printed(capsys):
    assert device_bytes.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines] == device_bytes.flavours()
    for name in device_bytes.flavours():
        r = device_bytes.model(flash_config(), name, 4096)
        assert r["experts"] < 1.02 and r["ratio"] <= device_bytes.TARGET
    assert "x weight bytes" in lines[0] and lines[0].endswith("ok (target <= 1.3x)")


def test_kv_rows_follow_each_layers_ratio():
    cfg = flash_config()
    assert device_bytes.kv_rows(cfg, 0, 4096) == (128, 0)  # ratio 0: the window only
    assert device_bytes.kv_rows(cfg, 2, 4096) == (128 + 512, 1024)  # ratio 4: indexer top 512 of 1024
    assert device_bytes.kv_rows(cfg, 3, 4096) == (128 + 32, 0)  # ratio 128
