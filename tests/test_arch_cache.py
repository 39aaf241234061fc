"""The on-disk memo of the HF-config parser: what it returns is the parser's result,
a second start reads it back without parsing, and anything that could change the
result (the config, the code) parses afresh; refusals are never stored."""
import os

import pytest

from inflight.models import arch_cache, hf_config
from inflight.models.hf_config import parse_hf_config

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 256, "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "tie_word_embeddings": True}
MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 256, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFLIGHT_CACHE_DIR", str(tmp_path))
    return tmp_path / "arch"


def _no_parsing(monkeypatch):
    def refuse(hf):
        raise AssertionError("parsed although the memo holds this config")
    monkeypatch.setattr(hf_config, "_parse_hf_config", refuse)


@pytest.mark.parametrize("hf", [LLAMA, MIXTRAL], ids=["llama-rope-scaling", "mixtral-moe"])
def test_a_memoized_parse_is_the_parse(cache, monkeypatch, hf):
    fresh = hf_config._parse_hf_config(hf)
    assert parse_hf_config(hf) == fresh  # stored
    assert len(os.listdir(cache)) == 1
    _no_parsing(monkeypatch)
    again = parse_hf_config(dict(hf))  # read back: equal field by field (dicts and lists included)
    assert again == fresh and again.rope_scaling == fresh.rope_scaling and again.moe_layers == fresh.moe_layers


def test_another_config_or_other_code_parses_afresh(cache, monkeypatch):
    parse_hf_config(LLAMA)
    calls = []
    real = hf_config._parse_hf_config
    monkeypatch.setattr(hf_config, "_parse_hf_config", lambda hf: calls.append(hf) or real(hf))
    assert parse_hf_config({**LLAMA, "rms_norm_eps": 1e-6}).rms_norm_eps == 1e-6
    assert len(calls) == 1
    monkeypatch.setattr(arch_cache, "code_version", lambda: "an edited model file")
    parse_hf_config(LLAMA)
    assert len(calls) == 2


def test_a_refused_config_is_refused_every_time(cache):
    bad = {**LLAMA, "architectures": ["NoSuchForCausalLM"]}
    for _ in range(2):
        with pytest.raises(ValueError, match="unsupported architecture"):
            parse_hf_config(bad)
    assert not cache.exists() or not os.listdir(cache)


def test_a_corrupt_entry_is_parsed_again_and_replaced(cache):
    want = parse_hf_config(LLAMA)
    (entry,) = cache.iterdir()
    entry.write_text('{"architecture": ')
    assert parse_hf_config(LLAMA) == want
    assert parse_hf_config(LLAMA) == want and entry.read_text().startswith('{"architecture": "Llama')
