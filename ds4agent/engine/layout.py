"""The canonical tensor table of a DS4 model file: every tensor's name, row-major shape and GGML type.

    for spec in tensor_table(cfg):              # file order (model.md §6.3, §1.1 general rules)
        spec.name, spec.shape, spec.ggml_type
    tensor_table(flash_config(), experts="q2")  # the routed experts typed as in ds4's q2 files

One table, read by everyone who needs to know what a file holds: the loader's directory check
(weights.check_directory: every tensor present, of the expected shape), the memory plan (which
tensors the engine reads), and the random-weight writers of ds4agent.testmodels (which tensors to
write). So a test file, the check that accepts it and the plan that sizes it can never disagree.

The types are those of a test file (routed experts F16, which test mode accepts) unless `experts`
names one of ds4's flavours; the loader accepts more types than listed for some tensors (see
weights.check_directory): the table says what is written, the check says what is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .config import ModelConfig
from .errors import EngineError

#: `general.architecture` of every DS4 file (the prefix of its `deepseek4.*` metadata keys).
ARCH = "deepseek4"

#: routed-expert tensor types of each flavour of ds4's files (model.md §6.3)
EXPERT_TYPES: dict[str, dict[str, str]] = {
    "q2": {"ffn_gate_exps": "IQ2_XXS", "ffn_up_exps": "IQ2_XXS", "ffn_down_exps": "Q2_K"},
    "q4": {"ffn_gate_exps": "Q4_K", "ffn_up_exps": "Q4_K", "ffn_down_exps": "Q4_K"},
    # The routed experts as DeepSeek released them (FP4 E2M1, E8M0 scale per 32): ggml's MXFP4.
    "mxfp4": {"ffn_gate_exps": "MXFP4", "ffn_up_exps": "MXFP4", "ffn_down_exps": "MXFP4"},
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # row-major array shape (GGML dims reversed)
    ggml_type: str  # "F32", "F16", "I32", "Q8_0", or an expert flavour's "IQ2_XXS", "Q2_K", "Q4_K", "MXFP4"

    @property
    def role(self) -> str:
        """The name without its layer prefix and suffix: "ffn_gate_exps" for blk.7.ffn_gate_exps.weight."""
        rest = self.name.split(".", 2)[2] if self.name.startswith("blk.") else self.name
        return rest.rsplit(".", 1)[0]


def tensor_table(cfg: ModelConfig, experts: str | None = None) -> list[TensorSpec]:
    """Every tensor of a DS4 file for `cfg`, in file order; `experts`: None (F16 routed experts,
    a test file) or a key of EXPERT_TYPES (ds4's quantised flavours)."""
    E, V, H, Dh = cfg.dim, cfg.vocab, cfg.n_heads, cfg.head_dim
    Q, G, O = cfg.q_lora_rank, cfg.out_groups, cfg.out_lora_rank
    n, mix = cfg.hc_count, cfg.hc_mix
    Hi, Di = cfg.indexer_heads, cfg.indexer_dim
    NE, U, F = cfg.n_experts, cfg.n_experts_used, cfg.expert_ffn
    t: list[TensorSpec] = [
        TensorSpec("token_embd.weight", (V, E), "F16"),
        TensorSpec("output_hc_fn.weight", (n, n * E), "F16"),
        TensorSpec("output_hc_scale.weight", (1,), "F32"),
        TensorSpec("output_hc_base.weight", (n,), "F32"),
        TensorSpec("output_norm.weight", (E,), "F32"),
        TensorSpec("output.weight", (V, E), "Q8_0"),
    ]
    for li in range(cfg.n_layers):
        b = f"blk.{li}."
        r = cfg.ratios[li]
        coff = cfg.coff(li)
        for sub in ("attn", "ffn"):
            t += [
                TensorSpec(f"{b}hc_{sub}_fn.weight", (mix, n * E), "F16"),
                TensorSpec(f"{b}hc_{sub}_scale.weight", (3,), "F32"),
                TensorSpec(f"{b}hc_{sub}_base.weight", (mix,), "F32"),
            ]
        t += [
            TensorSpec(f"{b}attn_norm.weight", (E,), "F32"),
            TensorSpec(f"{b}ffn_norm.weight", (E,), "F32"),
            TensorSpec(f"{b}attn_q_a.weight", (Q, E), "Q8_0"),
            TensorSpec(f"{b}attn_q_a_norm.weight", (Q,), "F32"),
            TensorSpec(f"{b}attn_q_b.weight", (H * Dh, Q), "Q8_0"),
            TensorSpec(f"{b}attn_kv.weight", (Dh, E), "Q8_0"),
            TensorSpec(f"{b}attn_kv_a_norm.weight", (Dh,), "F32"),
            TensorSpec(f"{b}attn_sinks.weight", (H,), "F32"),
            TensorSpec(f"{b}attn_output_a.weight", (G * O, (H // G) * Dh), "Q8_0"),
            TensorSpec(f"{b}attn_output_b.weight", (E, G * O), "Q8_0"),
        ]
        if r != 0:
            t += [
                TensorSpec(f"{b}attn_compressor_ape.weight", (r, coff * Dh), "F16"),
                TensorSpec(f"{b}attn_compressor_kv.weight", (coff * Dh, E), "F16"),
                TensorSpec(f"{b}attn_compressor_gate.weight", (coff * Dh, E), "F16"),
                TensorSpec(f"{b}attn_compressor_norm.weight", (Dh,), "F32"),
            ]
        if r == 4:
            t += [
                TensorSpec(f"{b}indexer.attn_q_b.weight", (Hi * Di, Q), "F16"),
                TensorSpec(f"{b}indexer.proj.weight", (Hi, E), "F16"),
                TensorSpec(f"{b}indexer_compressor_ape.weight", (4, 2 * Di), "F16"),
                TensorSpec(f"{b}indexer_compressor_kv.weight", (2 * Di, E), "F16"),
                TensorSpec(f"{b}indexer_compressor_gate.weight", (2 * Di, E), "F16"),
                TensorSpec(f"{b}indexer_compressor_norm.weight", (Di,), "F32"),
            ]
        t.append(TensorSpec(f"{b}ffn_gate_inp.weight", (NE, E), "F16"))
        if cfg.is_hash_layer(li):
            t.append(TensorSpec(f"{b}ffn_gate_tid2eid.weight", (V, U), "I32"))
        else:
            # Optional in a file (model.md §6.3): the directory check lets it be missing.
            t.append(TensorSpec(f"{b}exp_probs_b.bias", (NE,), "F32"))
        t += [
            # Test mode accepts F16 routed experts (model.md §1.1); ds4's files carry 2/4-bit blocks.
            TensorSpec(f"{b}ffn_gate_exps.weight", (NE, F, E), "F16"),
            TensorSpec(f"{b}ffn_up_exps.weight", (NE, F, E), "F16"),
            TensorSpec(f"{b}ffn_down_exps.weight", (NE, E, F), "F16"),
            TensorSpec(f"{b}ffn_gate_shexp.weight", (F, E), "Q8_0"),
            TensorSpec(f"{b}ffn_up_shexp.weight", (F, E), "Q8_0"),
            TensorSpec(f"{b}ffn_down_shexp.weight", (E, F), "Q8_0"),
        ]
    if experts is None:
        return t
    if experts not in EXPERT_TYPES:
        raise EngineError(f"unknown expert flavour {experts!r} (choose from {', '.join(EXPERT_TYPES)})")
    types = EXPERT_TYPES[experts]
    return [replace(s, ggml_type=types[s.role]) if s.role in types else s for s in t]
