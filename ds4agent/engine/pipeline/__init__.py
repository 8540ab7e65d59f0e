"""Pipeline parallelism: the model's layers split over the ranks of MLX's distributed ring.

    engine = load_engine(model_path, ctx=..., ranks=2)     # or hosts="hosts.json" (loader.py)
    s = engine.new_session(); s.sync(tokens); s.step(tok)  # the ordinary Session API
    engine.close()

    split.py    which layers each rank holds (balanced by bytes, or an explicit split)
    rank0.py    PipelineEngine: rank 0's Engine, the one the agent drives
    worker.py   serve: the loop of ranks 1..; worker_main: their process
    wire.py     the commands and the flat state format that cross the ring
    ring.py     Link: this process's rank in MLX's distributed ring (sends, receives, timeouts)
    launch.py   starting the ranks: local processes, or one per host over ssh

Rank 0 is this process: it holds the embedding and the first layers and runs the agent; rank k
holds the next contiguous range of layers, the last rank also the output head. A forward pass of
a chunk is: rank 0 sends the command (state keys and the chunk's token ids, which hash-routed
layers need) down the chain — MLX's ring links neighbours only, so each rank passes it on — runs
its layers and sends the hyper-connection residual R [n, hc, E] f32 to rank 1; each rank runs its
layers and passes R on; the last rank runs the head and sends the logits (one row, or every row
for dump-logits) to rank 0, its neighbour across the ring's wrap. Nothing else crosses the network
per token. The per-layer math is model.run_layers, exactly what one process runs, and CPU results
do not depend on where a graph is cut, so logits and state are bit-identical to one process.

State: every rank keeps its own layers' state, under keys rank 0 hands out (rank0.py).

Failure: rank 0 waits for every receive with a timeout (ring.Link); a lost rank is a
PipelineError (an EngineLost: the agent journals the session and ends it). Worker ranks wait for
commands without a time limit and exit when rank 0's connection goes away.
"""
