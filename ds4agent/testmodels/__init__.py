"""Writers of random-weight DS4 model files under the real tensor table (micro ... flash).

User-facing through `ds4agent make-test-model` (commands/make_test_model.py); used by the tests
and the benchmarks. Production code never imports this room: the engine reads what these files
hold through the same table (engine/layout.py) and the same metadata keys (engine/config.py)
as it reads ds4's own files.

    writer.py          make_test_model(path, config, seed, experts), named_config(name)
    flash.py           write_flash_model, plan_layout: the Flash-shape file with shared data
                       regions (its tensor directory describes the full 81 GB model in ~4.5 GB)
    values.py          fill_kind, random_values, q8_0_blocks, encode, add_config_metadata: what
                       the files hold and how it is encoded
    random_weights.py  random_tensors, weights_from_tensors, random_weights: the same values in
                       memory, as engine weights (imports MLX; import the module directly)

Arrows: testmodels imports engine (config, errors, layout, quant, weights), protocol (the
vocabulary table) and fsutil; nothing below imports it.
"""

from .writer import make_test_model, named_config

__all__ = ["make_test_model", "named_config"]
