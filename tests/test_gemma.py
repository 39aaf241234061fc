"""Gemma 2 and Gemma 3 (text) from HF folders: greedy float32 tokens equal transformers'
on tiny random-weight checkpoints whose windowed layers (an 8-token window, far shorter
than the prompts) alternate with global ones, alone, batched, in tiny chunks, under
preemption and prefix-cached, on the CPU fast path (the default) and on the plain-torch
reference. Gemma 2 runs with attention and final logit soft-caps, Gemma 3 with its q/k
norms and a RoPE base of its own for the windowed layers. Every run uses the hybrid KV
layout (a block table per layer group); a long request holds less KV than on the same
stack with every layer global, and gives every block back."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers

from inflight import LLM, SamplingParams
from inflight.config import CacheConfig, SchedulerConfig
from inflight.core.hybrid_kv import HybridKVCacheManager, group_layers
from inflight.core.kv_cache_manager import NULL_BLOCK, KVCacheManager
from inflight.core.scheduler import Scheduler
from inflight.kernels.cpu.packing import packed_linear_class
from inflight.loader.testing import TOKENS, write_tiny_gguf
from inflight.models.hf_config import parse_hf_config, text_part

pytestmark = pytest.mark.slow

WINDOW = 8
MAX_TOKENS = 12
SHARED = [7 + (5 * j) % 240 for j in range(40)]  # a prefix longer than two 16-token blocks
PROMPTS = [[5 + (i * 7 + j * 13) % 250 for j in range(6 + 11 * i)] for i in range(5)]
PROMPTS += [SHARED + [100, 101, 102], SHARED + [200, 201]]
SLIDING, FULL = "sliding_attention", "full_attention"


def _config(arch: str, window: int, gguf: bool = False):
    """``gguf``: only what llama.cpp's metadata can say (its layer pattern, local RoPE base
    and query_pre_attn_scalar of head_dim)."""
    kw = dict(vocab_size=len(TOKENS), hidden_size=64, intermediate_size=96, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, head_dim=24,  # head_dim * heads != hidden_size
              max_position_embeddings=256, rms_norm_eps=1e-6, sliding_window=window,
              query_pre_attn_scalar=24 if gguf else 20, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "gemma2":
        return transformers.Gemma2Config(**kw, attn_logit_softcapping=5.0, final_logit_softcapping=1.0,
                                         architectures=["Gemma2ForCausalLM"])
    if gguf:
        return transformers.Gemma3TextConfig(**{**kw, "num_hidden_layers": 6}, architectures=["Gemma3ForCausalLM"])
    return transformers.Gemma3TextConfig(**kw, layer_types=[SLIDING, SLIDING, FULL, SLIDING],
                                         rope_local_base_freq=100.0, architectures=["Gemma3ForCausalLM"])


def _model(arch: str, window: int, gguf: bool = False):
    torch.manual_seed(7)
    model = transformers.AutoModelForCausalLM.from_config(_config(arch, window, gguf)).eval()
    with torch.no_grad():  # Gemma's norm weights are offsets from one; make them matter
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(6.0)  # attention scores large enough for Gemma 2's soft-cap to change tokens
    return model


def _set_attn_cap(model, cap) -> None:
    model.config.attn_logit_softcapping = cap
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = cap


def _hf_logprobs(model, ids: list[int], new: list[int]) -> list[float]:
    """transformers' log-probability of each generated token."""
    with torch.no_grad():
        logits = model(torch.tensor([ids + new])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[len(ids) - 1 + i, t].item() for i, t in enumerate(new)]


def _hf_greedy(model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0)
    new = out[0, len(ids):].tolist()
    return new[: new.index(2) + 1] if 2 in new else new


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def checkpoint(request, tmp_path_factory):
    """(arch, HF folder, transformers' greedy tokens for every prompt)."""
    folder = tmp_path_factory.mktemp(request.param)
    write_tiny_gguf(str(folder / "tok.gguf"), None)
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file="tok.gguf")
    model = _model(request.param, WINDOW)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    want = [_hf_greedy(model, p) for p in PROMPTS]
    logprobs = _hf_logprobs(model, PROMPTS[2], want[2])
    if request.param == "gemma2":  # the soft-caps are tested: without them, other tokens and logprobs
        model.config.final_logit_softcapping = None
        assert max(abs(a - b) for a, b in zip(_hf_logprobs(model, PROMPTS[2], want[2]), logprobs)) > 1e-2
        _set_attn_cap(model, None)
        assert [_hf_greedy(model, p) for p in PROMPTS[2:5]] != want[2:5]
        _set_attn_cap(model, 5.0)
    # the same weights with no window in reach generate other tokens: the window is tested
    model.config.sliding_window = 1024
    assert [_hf_greedy(model, p) for p in PROMPTS[2:5]] != want[2:5]
    return request.param, str(folder), want, logprobs


def _run(llm, prompts) -> list[list[int]]:
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=sp,
                                                          use_tqdm=False)]


def _scheduler(llm, sched: dict | None = None, **cache) -> Scheduler:
    """The loaded model with other scheduler settings (and the engine's KV layout: a block
    table per layer group, windowed groups apart from global ones)."""
    eng = llm.llm_engine
    cfg = SchedulerConfig(**{**eng.config.scheduler_config.__dict__, **(sched or {})})
    cc = CacheConfig(**{**eng.config.cache_config.__dict__, **cache})
    eng.scheduler = Scheduler(cfg, cc, cc.num_gpu_blocks_override or eng.num_blocks, eng.max_model_len,
                              sliding_window=eng.scheduler.kv.sliding_window,
                              layer_windows=eng.executor.built.layer_windows)
    assert isinstance(eng.scheduler.kv, HybridKVCacheManager)
    return eng.scheduler


def test_layer_windows_from_config():
    """Each layer gets its type's window; no window is common to every layer."""
    g2 = parse_hf_config(_config("gemma2", WINDOW).to_dict())
    assert [g2.layer_sliding_window(i) for i in range(4)] == [WINDOW, None, WINDOW, None]
    assert g2.kv_sliding_window is None and g2.attn_logit_softcapping == 5.0
    g3 = parse_hf_config(_config("gemma3", WINDOW).to_dict())
    assert [g3.layer_sliding_window(i) for i in range(4)] == [WINDOW, WINDOW, None, WINDOW]
    assert (g3.rope_theta, g3.rope_local_base_freq) == (1_000_000.0, 100.0) and g3.qk_norm


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_greedy_equals_transformers(checkpoint, backend):
    arch, folder, want, logprobs = checkpoint
    llm = LLM(model=folder, dtype="float32", attention_backend=backend, kv_cache_memory=16 << 20,
              max_num_seqs=16, max_num_batched_tokens=256)
    model = llm.llm_engine.runner.model
    windows = [parse_hf_config(_config(arch, WINDOW).to_dict()).layer_sliding_window(i) for i in range(4)]
    assert [ly.self_attn.sliding_window for ly in model.layers] == windows
    # the hybrid layout: a block table per layer group, a pool per place in a group
    kv = llm.llm_engine.scheduler.kv
    assert isinstance(kv, HybridKVCacheManager) and kv.groups == group_layers(windows)
    pools = {id(c[0]) for c in llm.llm_engine.runner.kv_caches}
    assert len(pools) == len(kv.groups[0].layers) == {"gemma2": 2, "gemma3": 1}[arch]
    if backend == "auto" and packed_linear_class(torch.float32) is not None:
        # packed linears, op by op: the C layer loop has no GeGLU, (1 + w) norms or soft-caps
        assert isinstance(model.layers[0].mlp.down_proj, packed_linear_class(torch.float32))
        assert getattr(model, "layer_loop", None) is None
    if backend == "torch":
        assert type(model.layers[0].mlp.down_proj) is torch.nn.Linear

    for p, w in zip(PROMPTS[:3], want[:3]):
        assert _run(llm, [p]) == [w]
    assert _run(llm, PROMPTS) == want
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=1)
    out = llm.generate(prompt_token_ids=PROMPTS[2:3], sampling_params=sp, use_tqdm=False)[0].outputs[0]
    got = [lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids)]
    assert got == pytest.approx(logprobs, abs=1e-4)  # the final soft-cap is in the logits

    s = _scheduler(llm, {"long_prefill_token_threshold": 4, "max_num_batched_tokens": 8})
    assert _run(llm, PROMPTS) == want  # prefills in chunks of at most 4 tokens beside decodes
    assert s.kv.num_free_blocks == s.kv.num_blocks

    s = _scheduler(llm, num_gpu_blocks_override=4 * len(llm.llm_engine.scheduler.kv.groups))  # 4 per group
    assert _run(llm, PROMPTS) == want
    assert s.num_preemptions > 0

    s = _scheduler(llm, enable_prefix_caching=True)
    assert _run(llm, PROMPTS[-2:-1]) + _run(llm, PROMPTS[-1:]) == want[-2:]
    assert s.kv.prefix_cache_hits >= 32  # the second prompt's shared blocks came from the cache


def _all_global_copy(folder: str, dest) -> str:
    """The same checkpoint with every layer global."""
    shutil.copytree(folder, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(sliding_window=None, layer_types=[FULL] * cfg["num_hidden_layers"])
    (dest / "config.json").write_text(json.dumps(cfg))
    return str(dest)


def _held_mid_run(llm, prompt: list[int]) -> tuple[object, int]:
    """(the KV manager, pool blocks the request holds) once it has decoded a few tokens."""
    eng = llm.llm_engine
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    eng.add_request("long", {"prompt_token_ids": prompt}, sp)
    for _ in range(4):  # the prompt in one step, then decodes
        eng.step()
    kv = eng.scheduler.kv
    assert eng.scheduler.requests["long"].num_output_tokens >= 3
    return kv, kv.num_blocks_of("long")


def test_windowed_groups_free_blocks_behind_the_window(checkpoint, tmp_path):
    """A 100-token request: the global group holds all 7 of its 16-token blocks, each windowed
    group the 2 its 8-token window reaches (in the scheduler's and the worker's tables), so it
    holds fewer layer-blocks (bytes) than the all-global stack; every block comes back after
    it finishes and after an abort."""
    arch, folder, _, _ = checkpoint
    layer_block = 2 * 16 * 2 * 24 * 4  # K and V of 16 tokens, 2 KV heads of 24 float32 in one layer
    kw = dict(dtype="float32", kv_cache_memory=40 * 4 * layer_block, max_num_seqs=4, max_num_batched_tokens=256)
    prompt = [3 + (7 * j) % 250 for j in range(100)]
    kv_g, held_g = _held_mid_run(LLM(model=_all_global_copy(folder, tmp_path / "global"), **kw), prompt)
    assert isinstance(kv_g, KVCacheManager) and held_g == 7 and kv_g.num_blocks == 40
    llm = LLM(model=folder, **kw)
    kv, held = _held_mid_run(llm, prompt)
    assert isinstance(kv, HybridKVCacheManager)
    group_size, windowed = len(kv.groups[0].layers), [g.sliding_window is not None for g in kv.groups]
    assert kv.num_blocks == 40 * 4 // group_size  # the same bytes: a block holds fewer layers
    assert [m.num_blocks_of("long") for m in kv.managers] == [2 if w else 7 for w in windowed]
    assert held * group_size < held_g * 4
    worker_tables = llm.llm_engine.runner.requests.states["long"].block_ids
    for m, w, table in zip(kv.managers, windowed, worker_tables):
        assert (m.req_to_blocks["long"][0] is NULL_BLOCK) == w and (table[:5] == [0] * 5) == w
    while llm.llm_engine.has_unfinished_requests():
        llm.llm_engine.step()
    assert kv.num_free_blocks == kv.num_blocks
    kv, _ = _held_mid_run(llm, prompt[::-1])
    llm.llm_engine.abort_request("long")
    assert kv.num_free_blocks == kv.num_blocks
    kv.check_integrity()


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_gguf_greedy_equals_transformers(arch, tmp_path):
    """A GGUF file as llama.cpp's converter writes it (norm weights stored as 1 + w, the
    window and soft-caps in the metadata) gives transformers' tokens for the HF model."""
    model = _model(arch, WINDOW, gguf=True)
    path = str(tmp_path / f"{arch}.gguf")
    write_tiny_gguf(path, model, arch)
    want = [_hf_greedy(model, p) for p in PROMPTS[2:5]]
    llm = LLM(model=path, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=16, max_num_batched_tokens=256)
    arch_cfg = llm.llm_engine.arch
    assert arch_cfg.layer_types == model.config.layer_types and arch_cfg.sliding_window == WINDOW
    assert _run(llm, PROMPTS[2:5]) == want


def _multimodal(tmp_path):
    """A tiny Gemma3ForConditionalGeneration (a one-layer SigLIP tower) saved with a tokenizer."""
    text = _config("gemma3", WINDOW).to_dict()
    text.pop("architectures", None)
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    cfg = transformers.Gemma3Config(text_config=text, vision_config=vision.to_dict(), mm_tokens_per_image=4,
                                    image_token_index=5, boi_token_index=3, eoi_token_index=4, eos_token_id=[2, 6],
                                    architectures=["Gemma3ForConditionalGeneration"])
    torch.manual_seed(7)
    model = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(6.0)
    model.save_pretrained(tmp_path / "mm")
    write_tiny_gguf(str(tmp_path / "tok.gguf"), None)
    transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="tok.gguf").save_pretrained(tmp_path / "mm")
    return model


def test_gemma3_multimodal_checkpoint_serves_its_text_model(tmp_path):
    """Gemma 3 4B-27B ship as Gemma3ForConditionalGeneration: the decoder comes from text_config
    and the language_model tensors (under both names transformers saves them with), the vision
    tower and projector are skipped, the top level's EOS ids kept; greedy text equals the
    multimodal model's on text prompts."""
    from safetensors.torch import load_file, save_file

    model = _multimodal(tmp_path)
    want = [_hf_greedy(model, p) for p in PROMPTS[:4]]
    path = tmp_path / "mm" / "model.safetensors"
    tensors = load_file(path)
    assert any(k.startswith("vision_tower.") for k in tensors) and "language_model.model.norm.weight" in tensors
    with open(tmp_path / "mm" / "config.json") as f:
        raw = json.load(f)
    assert raw["text_config"]["eos_token_id"] == 2  # the top level's ids win
    assert text_part(raw)["eos_token_id"] == [2, 6] and text_part(raw)["hidden_size"] == 64
    for renamed in (False, True):
        if renamed:  # transformers 5's own layout: model.language_model.*, model.vision_tower.*
            save_file({("model." + k.replace("language_model.model.", "language_model.", 1)
                        if not k.startswith("lm_head") else k): v for k, v in tensors.items()}, path,
                      metadata={"format": "pt"})
        llm = LLM(model=str(tmp_path / "mm"), dtype="float32", kv_cache_memory=16 << 20, max_num_batched_tokens=256)
        assert llm.llm_engine.eos_token_ids[:2] == (2, 6)
        assert llm.llm_engine.arch.layer_types == [SLIDING, SLIDING, FULL, SLIDING]
        sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
        assert [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=PROMPTS[:4], sampling_params=sp,
                                                             use_tqdm=False)] == want
    # the hub's Gemma 3 folders may keep the chat template only in the processor's chat_template.json
    (tmp_path / "mm" / "chat_template.jinja").unlink()
    (tmp_path / "mm" / "chat_template.json").write_text(json.dumps({"chat_template": "{{ 'T' }}"}))
    llm = LLM(model=str(tmp_path / "mm"), dtype="float32", kv_cache_memory=16 << 20)
    assert llm.get_tokenizer().chat_template == "{{ 'T' }}"
