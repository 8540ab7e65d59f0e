"""KVC session files, byte-compatible with antirez/ds4 (docs/kvc-format.md).

    errors.py   KVCError and its subclasses (str(err) = the spec's message)
    payload.py  PayloadShape / LayerPayload / PayloadState (the engine contract) and the DSV4
                payload reader/writer (streamed; every length checked before allocating)
    kvc.py      48-byte header, text, trailers, the load chain 8.3, stand-alone validation,
                atomic writes
    store.py    the directory: naming, listing, prefix resolution, sysprompt caches, legacy-source
                deletion  (the API the agent uses: see its docstring)
    entries.py  what the directory holds, as values (entries, listed / saved / loaded sessions,
                file stamps); default_kv_dir; touch (in-place hit accounting)
    titles.py   session titles and how their bytes are shown
    index.py    the session index beside the directory: working directory, save time, fork
                parent and checkpoint key per session id
    undo.py     the undo log: what the file tools changed, so /rewind can put files back

`ds4agent kv ls|show|verify|rm` prints these files from ds4agent/commands/kv.py.

Imports nothing of the engine (numpy only); the agent connects the two.
"""
