"""DeepSeek V4's chat protocol: token ids and bytes, the prompt rendering and the DSML tool calls.

Pure Python (the `tokenizers` BPE and the standard library), no MLX: the agent renders and parses
with it, the commands print with it, the test-model writers take the vocabulary table from it. The
engine never imports it: it computes on token ids and knows nothing of what they mean.

    tokenizer.py   Tokenizer (ids <-> bytes, trusted / untrusted encoding), Text, TokenizerError,
                   the seven protocol specials BOS EOS USER ASSISTANT THINK END_THINK DSML,
                   VOCAB_SIZE, SPECIAL_STRINGS, as_bytes
    gguf_vocab.py  the tokenizer as GGUF metadata (tokenizer_metadata, vocabulary), as ds4's files
                   carry it
    template.py    the one renderer (render over system_prefix_pieces, user_turn_pieces,
                   tool_results_pieces, compacted_prefix_pieces, assistant_output_pieces; render_assistant_end,
                   render_dsml_block, ThinkMode, effective_think_mode, trim, ...) and its inverse
                   (split_turns, Turn: the turns read back from a transcript's ids)
    dsml.py        DsmlParser (streaming DSML parser and greedy-sampling classifier), its events,
                   RoundOutcome, and error_result: the one "invalid DSML" tool-result text
"""
