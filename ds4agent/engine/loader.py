"""Loading a model: `load_engine(path, ctx=...)` is the one way an Engine comes into being.

    engine = load_engine("model.gguf", ctx=100_000, progress=lambda f: ...)   # one process
    engine = load_engine(path, ctx=..., ranks=2)                             # a pipeline (pipeline/)
    ...
    engine.close()

One process, in this order (each step refuses before the next costs anything):
  1. the sizes (a typo in --ctx must not cost an 80 GB load);
  2. the device (device.py): the weights' layout follows the default device, so it is chosen
     before any weight is read;
  3. open the file and read its config (config.open_model: strict Flash checks, or the test
     checks for a make-test-model file);
  4. the tensor directory (weights.check_directory: every tensor present, typed and shaped);
  5. the memory plan (memory.py): a model that cannot fit is refused with the numbers, instead
     of swapping and being killed half-way through the load;
  6. the weights, materialised as they are built (session.materialize).
A directory written by `ds4agent convert` takes the same steps through convert.load_converted.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .config import open_model
from .convert import load_converted
from .device import use_device
from .errors import EngineError, PipelineError
from .gguf import TensorInfo
from .hostmem import keep_freed_memory, share_one_arena
from .memory import check_fits, memory_plan, model_info
from .pipeline.launch import launch
from .session import Engine, check_sizes
from .weights import check_directory, load_weights, tensor_in_range


def load_engine(model_path: str | os.PathLike[str], *, ctx: int, chunk: int | None = None,
                progress: Callable[[float], None] | None = None, ranks: int | None = None,
                hosts: str | os.PathLike[str] | None = None, split: Sequence[int] | None = None,
                device: str | None = None) -> Engine:
    """The engine a command runs: one process (on `device`: "cpu", "gpu" or None for the GPU
    when there is one), or a pipeline when `ranks` (local processes) or `hosts` (an mlx.launch
    hosts file) is given. Call close() when done.

    `progress(fraction)` is called as weights load (0..1). `chunk` overrides the prefill chunk
    cap (dump-logits --chunk, tests). A pipeline's ranks each take their machine's default device
    (its GPU when it has one): `device` is refused there rather than applied to rank 0 alone.
    Raises EngineError subclasses with readable messages (missing file, not a GGUF, wrong
    metadata, wrong tensor type/shape, too big for this machine, a pipeline rank lost)."""
    if ranks is None and hosts is None:
        if split:
            raise PipelineError("a pipeline split needs --pipeline N or --hosts FILE")
        return load_local(model_path, ctx=ctx, chunk=chunk, progress=progress, device=device)
    if device is not None:
        raise PipelineError("--device does not apply to a pipeline: each rank computes on its machine's "
                            "GPU when it has one, else its CPU")

    def load_part(layer_range: tuple[int, int]) -> Engine:
        return load_local(model_path, ctx=ctx, chunk=chunk, progress=progress, layer_range=layer_range)

    return launch(model_path, load_part, ctx=ctx, ranks=ranks, hosts=hosts, split=split)


def load_local(path: str | os.PathLike[str], *, ctx: int,
               progress: Callable[[float], None] | None = None, chunk: int | None = None,
               device: str | None = None, layer_range: tuple[int, int] | None = None) -> Engine:
    """One process's engine (the module docstring's steps). `layer_range` (start, stop): load
    only a pipeline rank's part (pipeline/ drives such an engine; its own sessions cannot run the
    whole model)."""
    path = Path(path)
    check_sizes(ctx, chunk)
    share_one_arena()  # threads allocate from the heap whose freed blocks are kept (hostmem.py)
    chosen = use_device(device)
    if progress is not None:
        progress(0.0)
    if path.is_dir():
        engine = _load_converted(path, ctx=ctx, progress=progress, chunk=chunk, layer_range=layer_range)
    else:
        gf, config = open_model(path)
        try:
            check_directory(gf, config)
            tensors: Iterable[TensorInfo] = gf.tensors.values()
            if layer_range is not None:
                tensors = [ti for ti in tensors if tensor_in_range(ti.name, config, layer_range)]
            check_fits(memory_plan(tensors, config, ctx), path)
            with _memory_errors(path):  # weights materialise as they are built
                weights = load_weights(gf, config, progress=progress, layer_range=layer_range)
            engine = _construct(path, config=config, weights=weights, ctx=ctx, quant_bits=quant_bits_of(gf),
                                path=path, chunk=chunk)
        except BaseException:
            gf.close()
            raise
        engine.gguf = gf  # keep the mapping alive: raw expert blocks may be views into it
    engine.device = chosen
    # From here on freed host blocks stay mapped for the next step's arrays (after the load, whose
    # large temporaries go back to the kernel at once: hostmem.py).
    keep_freed_memory()
    if progress is not None:
        progress(1.0)
    return engine


def _load_converted(path: Path, *, ctx: int, progress: Callable[[float], None] | None,
                    chunk: int | None, layer_range: tuple[int, int] | None) -> Engine:
    """An MLX directory written by `ds4agent convert`."""
    if layer_range is not None:
        raise EngineError(f"{path}: a pipeline runs GGUF files only, not converted MLX directories")
    try:
        plan = model_info(path, ctx=ctx).plan
    except EngineError:
        plan = None  # an incomplete conversion: load_converted names exactly what is missing
    if plan is not None:
        check_fits(plan, path)
    config, weights, qbits = load_converted(path, progress=progress)
    return _construct(path, config=config, weights=weights, ctx=ctx, quant_bits=qbits, path=path, chunk=chunk)


@contextlib.contextmanager
def _memory_errors(where: Path) -> Iterator[None]:
    """MLX reports running out of memory while weights materialise (as they are built, and in
    Engine.__init__'s final materialize) as RuntimeError/MemoryError: one readable line instead."""
    try:
        yield
    except (RuntimeError, MemoryError) as err:
        raise EngineError(f"{where}: cannot hold the model's weights in memory ({err or 'out of memory'})") from None


def _construct(where: Path, **kw: Any) -> Engine:
    """Engine(**kw), whose materialize() evaluates what the loaders left lazy."""
    with _memory_errors(where):
        return Engine(**kw)


def quant_bits_of(gf: Any) -> int:
    """KVC header quant_bits (kvc-format.md §2): 4 if layer 0's routed gate experts are Q4_K
    (or another 4-bit type, MXFP4 included), else 2 (ds4's own rule; test models with F16 experts
    count as 2)."""
    ti = gf.tensors.get("blk.0.ffn_gate_exps.weight")
    if ti is not None and ti.type_name in ("Q4_K", "Q4_0", "Q4_1", "IQ4_XS", "IQ4_NL", "MXFP4"):
        return 4
    return 2
