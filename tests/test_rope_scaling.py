"""RoPE scaling variants (llama3, linear, dynamic NTK, yarn): our inverse frequencies and
cos/sin tables equal transformers' for the same config, parsed from its config.json."""
from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from inflight.layers.rotary import RotaryEmbedding, rope_inv_freq
from inflight.models.hf_config import parse_hf_config

MAX_POS = 256
VARIANTS = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn-mscale": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
                    "beta_fast": 16, "beta_slow": 2, "mscale": 0.9, "mscale_all_dim": 0.7},
}


def _hf_config(scaling: dict, model_type: str = "llama") -> transformers.PretrainedConfig:
    cls = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config}[model_type]
    cfg = cls(hidden_size=128, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, head_dim=64, vocab_size=32, max_position_embeddings=MAX_POS,
              rope_parameters={"rope_theta": 50000.0, **scaling})
    cfg.architectures = [cls.__name__.replace("Config", "ForCausalLM")]
    return cfg


def _hf_cos_sin(cfg: transformers.PretrainedConfig, positions: int):
    """transformers' cos/sin for one sequence of ``positions`` tokens, as its model computes them."""
    module = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)
    pos = torch.arange(positions)[None]
    cos, sin = module(torch.zeros(1, positions, 64), pos)
    return cos[0], sin[0]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_inv_freq_and_tables_equal_transformers(name):
    hf = _hf_config(VARIANTS[name])
    ours = parse_hf_config(hf.to_dict())  # through config.json's dict, as the loader reads it
    assert ours.rope_scaling["rope_type"] == VARIANTS[name]["rope_type"]
    for length in (MAX_POS, 2 * MAX_POS):  # the model's context, and served beyond it
        inv, scale = rope_inv_freq(ours, torch.device("cpu"), length)
        want_inv, want_scale = ROPE_INIT_FUNCTIONS[VARIANTS[name]["rope_type"]](hf, torch.device("cpu"), seq_len=length)
        assert torch.equal(inv, want_inv), name
        assert scale == pytest.approx(want_scale, rel=1e-12)
        table = RotaryEmbedding(ours, length)
        cos, sin = _hf_cos_sin(hf, length)
        torch.testing.assert_close(table.cos, cos, rtol=0, atol=1e-6)
        torch.testing.assert_close(table.sin, sin, rtol=0, atol=1e-6)
    if name.startswith("yarn"):
        assert scale > 1.0  # the attention factor reaches the tables


def test_dynamic_ntk_is_plain_rope_within_the_context():
    hf = _hf_config(VARIANTS["dynamic"])
    inv, _ = rope_inv_freq(parse_hf_config(hf.to_dict()), torch.device("cpu"), MAX_POS)
    plain, _ = rope_inv_freq(parse_hf_config(_hf_config({"rope_type": "default"}).to_dict()), torch.device("cpu"))
    assert torch.equal(inv, plain)
    longer, _ = rope_inv_freq(parse_hf_config(hf.to_dict()), torch.device("cpu"), 4 * MAX_POS)
    assert (longer[1:] < plain[1:]).all()  # a larger base beyond it


def test_unknown_rope_type_is_refused():
    cfg = parse_hf_config(_hf_config(VARIANTS["linear"]).to_dict())
    cfg.rope_scaling = {"rope_type": "mrope"}
    with pytest.raises(ValueError, match="mrope"):
        rope_inv_freq(cfg, torch.device("cpu"))


# Phi-4-mini's form, small: RoPE on 8 of 16 dims, LongRoPE factors per frequency
PHI4 = dict(partial_rotary_factor=0.5, max_position_embeddings=512, original_max_position_embeddings=128,
            rope_scaling={"rope_type": "longrope", "short_factor": [1.0, 1.7, 2.9, 5.3],
                          "long_factor": [3.0, 5.0, 9.0, 17.0]})


def _phi4():
    from inflight.loader.testing import tiny_model

    model = tiny_model("phi3", **PHI4)
    return model.model.rotary_emb, parse_hf_config(model.config.to_dict())


def test_longrope_turns_by_the_long_factors_when_the_context_passes_the_pretraining_length():
    """As vLLM: a table of at most original_max_position_embeddings positions (max_model_len)
    turns by the short factors, a longer one turns every position by the long ones, which is
    what transformers does for a sequence of that length."""
    hf, ours = _phi4()
    assert ours.rotary_dim == 8 and ours.rope_scaling["original_max_position_embeddings"] == 128
    r = ours.rotary_dim // 2
    for positions in (128, 300):
        table = RotaryEmbedding(ours, positions)
        want_cos, want_sin = hf(torch.zeros(1), torch.arange(positions)[None])
        torch.testing.assert_close(table.cos[:, :r], want_cos[0, :, :r], rtol=0, atol=1e-6)
        torch.testing.assert_close(table.sin[:, :r], want_sin[0, :, :r], rtol=0, atol=1e-6)
        assert want_cos.abs().max() > 1.0  # the attention factor, sqrt(1 + ln 4 / ln 128), scales them
    short, long = RotaryEmbedding(ours, 128), RotaryEmbedding(ours, 300)
    assert not torch.allclose(short.cos[:, :r], long.cos[:128, :r])  # the two factor sets differ


def test_partial_rotary_is_a_full_rotate_half_over_permuted_heads():
    """transformers turns the first 8 of 16 dims (pairs i, i + 4) and leaves 8; the same
    scores come from permuting both heads and turning all 16 with the tables (pairs i, i + 8,
    the last four with cos 1 and sin 0), and un-permuting gives transformers' q exactly."""
    from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

    from inflight.layers.rotary import apply_rope, rotary_head_permutation

    hf, ours = _phi4()
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 40, 16), torch.randn(1, 1, 40, 16)
    cos, sin = hf(q, torch.arange(40)[None])
    hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
    perm = rotary_head_permutation(16, 8)
    assert sorted(perm) == list(range(16))
    table = RotaryEmbedding(ours, 64)
    mq, mk = apply_rope(q[0, 0][:, perm], k[0, 0][:, perm], table.cos[:40], table.sin[:40])
    torch.testing.assert_close(mq @ mk.T, hq[0, 0] @ hk[0, 0].T, rtol=1e-5, atol=1e-5)
    inverse = [perm.index(i) for i in range(16)]
    torch.testing.assert_close(mq[:, inverse], hq[0, 0], rtol=1e-6, atol=1e-6)
