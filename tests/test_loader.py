"""Tests of inflight.loader on good inputs: GGUF files and HF folders, the cache, tokenizers
(what it refuses, streaming into a model and config parsing: test_loader_errors.py).

The embedded SmolLM2 GGUF is checked against transformers' own GGUF loading
(marked slow: ~25 s). Everything else runs on tiny models from
inflight.loader.testing, whose GGUF files carry llama.cpp's Q/K permutation
applied by a copy of its converter's code, so loading them back must give the
original weights exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
import transformers
from hf_reference import load_hf_reference
from loader_fixtures import tiny_gguf_dir, tiny_tokenizer  # noqa: F401 (fixtures)

from inflight.loader import default_model_path, load_model, load_tokenizer
from inflight.loader import api as loader_api
from inflight.loader import cache as loader_cache
from inflight.loader.testing import CHAT_TEMPLATE, TOKENS, rope_theta, tiny_model, write_tiny_gguf


def expected_weights(model: transformers.PreTrainedModel) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors as stored (the loader casts only into the parameters)."""
    sd = dict(model.state_dict())
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


def assert_weights_equal(ours, ref: dict[str, torch.Tensor]) -> None:
    assert sorted(ours) == sorted(ref)
    for name, value in ref.items():
        assert ours[name].dtype == value.dtype, name
        assert torch.equal(ours[name], value), name


# --------------------------------------------------------- the embedded model


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """Uncached then cached load of the embedded model, with wall times."""
    cache_dir = str(tmp_path_factory.mktemp("cache"))
    t0 = time.perf_counter()
    first = load_model(cache_dir=cache_dir)
    t1 = time.perf_counter()
    second = load_model(cache_dir=cache_dir)
    t2 = time.perf_counter()
    print(f"\nembedded model: first load {t1 - t0:.2f} s, cached load {t2 - t1:.2f} s")
    return {"first": first, "second": second, "times": (t1 - t0, t2 - t1), "cache_dir": cache_dir}


@pytest.mark.slow
def test_embedded_weights_equal_transformers(embedded):
    ref = load_hf_reference()
    ref_sd = {k: v for k, v in ref.state_dict().items() if k != "lm_head.weight"}
    assert_weights_equal(embedded["first"].weights, ref_sd)
    # The cached copy is bit-identical to the freshly dequantized one.
    assert_weights_equal(embedded["second"].weights, ref_sd)


@pytest.mark.slow
def test_embedded_config(embedded):
    model = embedded["first"]
    cfg = model.hf_config
    assert model.source == os.path.realpath(default_model_path())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (576, 1536, 30)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert cfg["vocab_size"] == 49152 and cfg["tie_word_embeddings"] is True
    assert cfg["rope_theta"] == 100000.0 and cfg["rope_scaling"] is None
    assert cfg["max_position_embeddings"] == 8192
    assert cfg["rms_norm_eps"] == pytest.approx(1e-5)
    assert cfg["torch_dtype"] == "float32"
    assert model.eos_token_ids == [2]
    assert embedded["second"].hf_config == cfg
    ref = load_hf_reference().config
    assert cfg["rms_norm_eps"] == ref.rms_norm_eps and cfg["eos_token_id"] == ref.eos_token_id


@pytest.mark.slow
def test_embedded_tokenizer(embedded):
    direct, cached = embedded["first"].tokenizer, embedded["second"].tokenizer
    text = "Hello, world! Ünïcode and  spaces\nnew line 12345"
    for tok in (direct, cached):
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
        assert ids == direct.encode(text, add_special_tokens=False)
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
        )
        assert "<|im_start|>user\nhi<|im_end|>\n" in prompt
        assert prompt.endswith("<|im_start|>assistant\n")
        assert tok.convert_ids_to_tokens(2) == "<|im_end|>"
    assert cached.chat_template == direct.chat_template
    t0 = time.perf_counter()
    assert load_tokenizer(cache_dir=embedded["cache_dir"]).chat_template == direct.chat_template
    assert time.perf_counter() - t0 < 2.0  # from the cache, not re-converted from the GGUF


@pytest.mark.slow
def test_a_cache_entrys_tokenizer_is_autotokenizers_without_importing_it(embedded):
    (entry,) = os.listdir(embedded["cache_dir"])
    folder = os.path.join(embedded["cache_dir"], entry, "tokenizer")
    ours, auto = embedded["second"].tokenizer, transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert type(ours) is type(auto)
    assert ours.get_vocab() == auto.get_vocab() and ours.special_tokens_map == auto.special_tokens_map
    assert (ours.model_max_length, ours.padding_side, ours.truncation_side) == \
        (auto.model_max_length, auto.padding_side, auto.truncation_side)
    text = "<|im_start|>user\nHello, world! Ünïcode  12345<|im_end|>"
    assert ours(text).input_ids == auto(text).input_ids
    chat = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        auto.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    # AutoTokenizer's import scans every model's module in transformers: a start-up cost
    check = ("import sys; from inflight.loader import load_model; "
             f"load_model(cache_dir={embedded['cache_dir']!r}); "
             "print('transformers.models.auto.tokenization_auto' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split()[-1] == "False", out.stderr[-2000:]


@pytest.mark.slow
def test_second_load_hits_cache(embedded):
    first, second = embedded["times"]
    assert second < first / 3, embedded["times"]
    (entry,) = os.listdir(embedded["cache_dir"])
    assert {"weights.safetensors", "config.json", "tokenizer", "meta.json"} <= set(
        os.listdir(os.path.join(embedded["cache_dir"], entry))
    )


# ------------------------------------------------------------ tiny GGUF files


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "phi3"])
def test_tiny_gguf_roundtrip(tiny_gguf_dir, tmp_path, arch):
    path = os.path.join(tiny_gguf_dir, f"{arch}.gguf")
    model = load_model(path, cache_dir=str(tmp_path))
    tie = arch in ("llama", "qwen3")
    source = tiny_model(arch, tie=tie)
    assert_weights_equal(model.weights, expected_weights(source))
    cfg = model.hf_config
    assert cfg["model_type"] == arch and cfg["tie_word_embeddings"] == tie
    head_dim = 128 if arch == "qwen3" else 16  # Qwen3Config's own default, not hidden / heads
    assert (cfg["hidden_size"], cfg["num_key_value_heads"], cfg["head_dim"]) == (64, 2, head_dim)
    assert cfg["vocab_size"] == len(TOKENS) and model.eos_token_ids == [2]
    assert model.tokenizer.chat_template == CHAT_TEMPLATE
    # transformers' own GGUF conversion agrees (independent check of the un-permutation).
    ref_sd = {k: v for k, v in load_hf_reference(path).state_dict().items()}
    if cfg["tie_word_embeddings"]:
        ref_sd.pop("lm_head.weight")
    assert_weights_equal(model.weights, ref_sd)


def test_cached_load_skips_dequantizing(tiny_gguf_dir, tmp_path, monkeypatch):
    path = os.path.join(tiny_gguf_dir, "llama.gguf")
    first = load_model(path, cache_dir=str(tmp_path))

    def fail(*args, **kwargs):
        raise AssertionError("dequantized again despite a valid cache entry")

    monkeypatch.setattr(loader_api, "gguf_weights", fail)
    monkeypatch.setattr(loader_api, "open_gguf", fail)
    second = load_model(path, cache_dir=str(tmp_path))
    assert_weights_equal(second.weights, first.weights)
    assert second.hf_config == first.hf_config and second.eos_token_ids == first.eos_token_ids
    assert second.tokenizer.chat_template == CHAT_TEMPLATE


def test_cache_dir_from_environment(tiny_gguf_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("INFLIGHT_CACHE_DIR", str(tmp_path / "env"))
    load_model(os.path.join(tiny_gguf_dir, "llama.gguf"))
    # the root is shared with the kernel builds and the parsed-config memo (kernels/, arch/)
    assert len([n for n in os.listdir(tmp_path / "env") if n.startswith("llama.gguf-")]) == 1


def _truncate(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


def _scramble_header(path: str) -> None:
    with open(path, "r+b") as f:  # same size, unreadable safetensors header
        f.seek(8)
        f.write(b"\xff" * 16)


CORRUPTIONS = {
    "truncated weights": lambda e: _truncate(os.path.join(e, "weights.safetensors")),
    "scrambled weights": lambda e: _scramble_header(os.path.join(e, "weights.safetensors")),
    "garbage meta": lambda e: open(os.path.join(e, "meta.json"), "w").write("{not json"),
    "missing meta": lambda e: os.remove(os.path.join(e, "meta.json")),
    "missing tokenizer": lambda e: os.remove(os.path.join(e, "tokenizer", "tokenizer.json")),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupt_cache_entry_is_rebuilt(tiny_gguf_dir, tmp_path, corruption):
    path = os.path.join(tiny_gguf_dir, "llama.gguf")
    good = load_model(path, cache_dir=str(tmp_path))
    entry = loader_cache.entry_dir(os.path.realpath(path), str(tmp_path))
    CORRUPTIONS[corruption](entry)
    again = load_model(path, cache_dir=str(tmp_path))
    assert_weights_equal(again.weights, good.weights)
    assert loader_cache.entry_is_valid(entry, os.path.realpath(path))


def test_interrupted_cache_write_leaves_no_entry(tiny_gguf_dir, tmp_path):
    path = os.path.realpath(os.path.join(tiny_gguf_dir, "llama.gguf"))
    model = load_model(path, cache_dir=str(tmp_path / "unused"))
    entry = loader_cache.entry_dir(path, str(tmp_path))

    class DiesWhileSaving:  # stands in for a process killed half-way through a write
        def save_pretrained(self, folder):
            os.makedirs(folder)
            open(os.path.join(folder, "tokenizer.json"), "w").write("{")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        loader_cache.write_entry(entry, path, model.hf_config, model.weights, DiesWhileSaving())
    assert not os.path.exists(entry)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]  # cleaned up on the way out
    os.makedirs(os.path.join(tmp_path, ".tmp-left-by-kill-9"))  # what SIGKILL would leave
    again = load_model(path, cache_dir=str(tmp_path))
    assert_weights_equal(again.weights, model.weights)
    assert loader_cache.entry_is_valid(entry, path)


def test_a_second_writer_keeps_the_valid_entry_a_loader_is_reading(tiny_gguf_dir, tmp_path):
    """Two processes that both missed the cache (data-parallel replicas starting at once) both
    write an entry; the later one must not swap out the files the first is reading lazily."""
    path = os.path.realpath(os.path.join(tiny_gguf_dir, "llama.gguf"))
    first = load_model(path, cache_dir=str(tmp_path))  # reads its weights back from the entry
    entry = loader_cache.entry_dir(path, str(tmp_path))
    weights = os.path.join(entry, loader_cache.WEIGHTS_FILE)
    inode = os.stat(weights).st_ino
    assert loader_cache.write_entry(entry, path, first.hf_config, first.weights, first.tokenizer)
    assert os.stat(weights).st_ino == inode  # the same file, still there
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]
    assert_weights_equal(load_model(path, cache_dir=str(tmp_path)).weights, first.weights)


def test_unwritable_cache_still_loads(tiny_gguf_dir, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("the cache root cannot be created under a regular file")
    model = load_model(os.path.join(tiny_gguf_dir, "llama.gguf"), cache_dir=str(blocker / "cache"))
    assert model.hf_config["model_type"] == "llama"


def test_changed_source_gets_new_entry(tmp_path):
    path = str(tmp_path / "m.gguf")
    write_tiny_gguf(path, tiny_model("llama", seed=1))
    first = load_model(path, cache_dir=str(tmp_path / "c"))
    write_tiny_gguf(path, tiny_model("llama", seed=2))
    os.utime(path, ns=(1, 1))  # guarantee a different mtime even on coarse clocks
    second = load_model(path, cache_dir=str(tmp_path / "c"))
    assert not torch.equal(first.weights["model.norm.weight"], second.weights["model.norm.weight"])
    assert_weights_equal(second.weights, expected_weights(tiny_model("llama", seed=2)))


def test_load_tokenizer_from_gguf(tiny_gguf_dir, tmp_path):
    tok = load_tokenizer(os.path.join(tiny_gguf_dir, "qwen2.gguf"), cache_dir=str(tmp_path))
    assert tok.chat_template == CHAT_TEMPLATE
    assert tok.decode(tok.encode("the hello", add_special_tokens=False)) == "the hello"


# ------------------------------------------------------------------ HF folders


@pytest.mark.parametrize(
    "arch,tie,dtype,shard",
    [("llama", False, None, True), ("mistral", True, None, False), ("qwen2", True, torch.bfloat16, False)],
)
def test_hf_folder(tmp_path, tiny_tokenizer, arch, tie, dtype, shard):
    source = tiny_model(arch, tie=tie)
    if dtype is not None:
        source = source.to(dtype)
    source.save_pretrained(tmp_path, max_shard_size="100KB" if shard else "1GB")
    tiny_tokenizer.save_pretrained(tmp_path)
    assert os.path.exists(tmp_path / "model.safetensors.index.json") == shard
    model = load_model(str(tmp_path))
    assert_weights_equal(model.weights, expected_weights(source))
    cfg = model.hf_config
    assert cfg["architectures"] == [type(source).__name__] and cfg["model_type"] == arch
    assert (cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]) == (2, 2, 16)
    assert cfg["rope_theta"] == rope_theta(source.config)
    assert cfg["tie_word_embeddings"] is tie and cfg["torch_dtype"] == str(dtype or torch.float32)[6:]
    assert model.eos_token_ids == [2] and model.source == os.path.realpath(tmp_path)
    assert model.tokenizer.chat_template == CHAT_TEMPLATE
    assert load_tokenizer(str(tmp_path)).encode("the") == tiny_tokenizer.encode("the")


def test_hf_folder_eos_from_generation_config(tmp_path, tiny_tokenizer):
    tiny_model("llama").save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    assert load_model(str(tmp_path)).eos_token_ids == [2, 0]
