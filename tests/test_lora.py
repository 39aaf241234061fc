"""LoRA adapters: greedy tokens equal transformers + PEFT on a tiny random Llama, each
adapter alone and mixed with others and the base model in one batch, on the CPU fast
path and the plain-torch reference; bad adapters fail their own request only; served
under their names over the OpenAI API, loaded and unloaded at run time."""
from __future__ import annotations

import copy
import shutil

import httpx
import openai
import peft
import pytest
import safetensors.torch
import torch
import transformers

from inflight import LLM, LoRARequest, SamplingParams
from inflight.kernels.cpu.packing import packed_linear_class
from inflight.loader.testing import tiny_model, write_tiny_gguf
from inflight.lora.layers import LoRALinear
from inflight.lora.testing import write_random_adapter
from inflight.models.registry import arch_spec

pytestmark = pytest.mark.slow

MAX_TOKENS = 8
SHARED = [7 + (5 * j) % 240 for j in range(40)]  # spans two 16-token blocks
PROMPTS = [[5 + (i * 7 + j * 13) % 250 for j in range(6 + 11 * i)] for i in range(4)] + [SHARED + [100, 101]]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name -> (seed, rank, target modules, extra LoraConfig fields)
ADAPTERS = {"a": (1, 8, ALL, {}), "b": (2, 4, ["q_proj", "v_proj", "down_proj"], {"use_rslora": True}),
            "big": (3, 32, ["q_proj"], {})}


def _greedy(model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(base model folder, adapter folders by name, PEFT's greedy tokens by adapter name, None: base)."""
    root = tmp_path_factory.mktemp("lora")
    write_tiny_gguf(str(root / "tok.gguf"), None)
    tok = transformers.AutoTokenizer.from_pretrained(root, gguf_file="tok.gguf")
    base = tiny_model("llama", seed=3).eval()
    base.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    paths, want = {}, {None: [_greedy(base, p) for p in PROMPTS]}
    for name, (seed, rank, targets, extra) in ADAPTERS.items():
        torch.manual_seed(seed)
        # init_lora_weights=False: B random too, so every adapter changes the tokens
        cfg = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False, **extra)
        model = peft.get_peft_model(copy.deepcopy(base), cfg).eval()
        model.save_pretrained(root / name)
        paths[name] = str(root / name)
        if name in ("a", "b"):
            want[name] = [_greedy(model, p) for p in PROMPTS]
    for name in ("a", "b"):
        assert want[name] != want[None]
    return str(root / "base"), paths, want


def _llm(folders, **kw) -> LLM:
    kw = {"dtype": "float32", "enable_lora": True, "max_loras": 2, "kv_cache_memory": 16 << 20,
          "max_num_batched_tokens": 256, **kw}
    return LLM(folders[0], **kw)


def _lora(folders, name: str, lid: int) -> LoRARequest:
    return LoRARequest(name, lid, folders[1][name])


def _run(llm, prompts, loras) -> list[list[int]]:
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=sp, lora_request=loras, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_mixed_batch_equals_peft(folders, backend):
    llm = _llm(folders, attention_backend=backend)
    a, b = _lora(folders, "a", 1), _lora(folders, "b", 2)
    want = folders[2]
    model = llm.llm_engine.runner.model
    down = model.layers[0].mlp.down_proj
    assert isinstance(down, LoRALinear)
    if backend == "auto" and packed_linear_class(torch.float32) is not None:
        assert isinstance(down.base_layer, packed_linear_class(torch.float32))  # over the packed projection
    for lora, name in ((a, "a"), (b, "b"), (None, None)):
        assert _run(llm, PROMPTS[:1], lora) == want[name][:1]
    loras = [a, b, None] * len(PROMPTS)
    prompts = [p for p in PROMPTS for _ in range(3)]
    expect = [want[name][i] for i in range(len(PROMPTS)) for name in ("a", "b", None)]
    assert _run(llm, prompts, loras) == expect
    kv = llm.llm_engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_blocks


def test_partial_rotary_adapter_equals_peft(tmp_path):
    """Phi-4-mini's form keeps each q and k head's dims permuted (partial rotary run as a
    full-width rotate-half): an adapter's qkv_proj B rows follow, so its tokens are PEFT's."""
    from test_model_archs import PHI4, _sharpen

    write_tiny_gguf(str(tmp_path / "tok.gguf"), None)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="tok.gguf")
    base = tiny_model("phi3", seed=3, **PHI4).eval()
    _sharpen(base)
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    torch.manual_seed(5)
    cfg = peft.LoraConfig(r=8, lora_alpha=32, target_modules=["qkv_proj"], init_lora_weights=False)
    model = peft.get_peft_model(copy.deepcopy(base), cfg).eval()
    model.save_pretrained(tmp_path / "adapter")
    want = [_greedy(model, p) for p in PROMPTS]
    assert want != [_greedy(base, p) for p in PROMPTS]
    llm = LLM(str(tmp_path / "base"), dtype="float32", enable_lora=True, kv_cache_memory=16 << 20,
              max_num_batched_tokens=256, max_model_len=128)  # LongRoPE's short factors, as PEFT's short prompts
    assert _run(llm, PROMPTS, LoRARequest("adapter", 1, str(tmp_path / "adapter"))) == want


def test_every_step_runs_in_the_fused_layer_loop(folders, monkeypatch):
    llm = _llm(folders)
    model = llm.llm_engine.runner.model
    if model.layer_loop is None:
        pytest.skip("no C layer loop on this machine")  # never on x86-64 with AVX2 (test_isa checks)
    loop = model.layer_loop.loop
    loops, forwards = [], []
    monkeypatch.setattr(loop, "run", lambda *a, _run=loop.run, **kw: loops.append(1) or _run(*a, **kw))
    monkeypatch.setattr(model, "forward", lambda *a, _fwd=model.forward: forwards.append(1) or _fwd(*a))
    a = _lora(folders, "a", 1)
    assert _run(llm, PROMPTS[:2], None) == folders[2][None][:2]
    assert _run(llm, PROMPTS[:4], [a, None, a, None]) == [folders[2][n][i] for i, n in enumerate(["a", None] * 2)]
    assert len(loops) == len(forwards) == 2 * MAX_TOKENS  # base and adapter steps alike: one C call each


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_layer_loop_equals_op_by_op(tmp_path, dtype):
    """SmolLM2 with two random adapters, mixed with the base model in steps of decodes and
    prefill chunks: the adapters' GEMMs in the C layer loop and in the Python layers give
    the same logprobs, bit for bit (as tests/test_cpu_layer_loop.py checks for the base model)."""
    llm = LLM(dtype=dtype, enable_lora=True, max_loras=2, max_num_batched_tokens=64, max_num_seqs=4,
              enable_prefix_caching=False)
    engine, model = llm.llm_engine, llm.llm_engine.runner.model
    assert model.layer_loop is not None  # every CPU with kernels runs it
    loras = []
    for i in (1, 2):
        write_random_adapter(str(tmp_path / f"r{i}"), engine.runner.lora.targets,
                             arch_spec(engine.arch.architecture).stacked, 8, i, scale=0.05)
        loras.append(LoRARequest(f"r{i}", i, str(tmp_path / f"r{i}")))
    prompts = ["The capital of France is", "Here is a long story about a lighthouse keeper. " * 12, "1, 2, 3,",
               "Here is a long story about a lighthouse keeper. " * 8 + "His name was"]
    sp = SamplingParams(temperature=0.0, max_tokens=10, logprobs=3)

    def run(lora):
        return [(o.outputs[0].token_ids, o.outputs[0].logprobs)
                for o in llm.generate(prompts, sp, lora_request=lora, use_tqdm=False)]

    mixed = [loras[0], loras[1], None, loras[0]]
    fused = run(mixed)
    assert fused[0] != run(None)[0]  # the adapters change the logprobs
    loop, model.layer_loop = model.layer_loop, None
    try:
        assert run(mixed) == fused
    finally:
        model.layer_loop = loop


def test_one_adapter_a_step_with_max_loras_1(folders, monkeypatch):
    llm = _llm(folders, max_loras=1)
    lora = llm.llm_engine.runner.lora
    seen = []
    set_batch = lora.set_batch
    monkeypatch.setattr(lora, "set_batch", lambda spans: seen.append({r.lora_int_id for r, _, _ in spans if r})
                        or set_batch(spans))
    a, b = _lora(folders, "a", 1), _lora(folders, "b", 2)
    got = _run(llm, PROMPTS[:3] * 2, [a, b, a, b, a, b])
    want = folders[2]
    assert got == [want["a"][0], want["b"][1], want["a"][2], want["b"][0], want["a"][1], want["b"][2]]
    assert max(len(ids) for ids in seen) == 1 and {1, 2} <= set().union(*seen)


def test_preemption_and_drafts_keep_each_requests_adapter(folders):
    """Recompute preemption resends a request to the worker with its adapter, and n-gram
    drafts are verified under it: the tokens stay PEFT's."""
    want = folders[2]
    a, b = _lora(folders, "a", 1), _lora(folders, "b", 2)
    loras = [a, b, None, b, a]
    expect = [want[lora.lora_name if lora else None][i] for i, lora in enumerate(loras)]
    llm = _llm(folders, num_gpu_blocks_override=8, max_num_batched_tokens=32)
    assert _run(llm, PROMPTS, loras) == expect
    assert llm.llm_engine.scheduler.num_preemptions > 0
    llm = _llm(folders, speculative_config={"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1})
    assert _run(llm, PROMPTS, loras) == expect
    assert llm.llm_engine.scheduler.num_accepted_tokens > 0


def test_prefix_cache_never_serves_another_adapters_kv(folders):
    llm = _llm(folders, enable_prefix_caching=True)
    kv = llm.llm_engine.scheduler.kv
    want = folders[2]
    a = _lora(folders, "a", 1)
    assert _run(llm, PROMPTS[-1:], None) == want[None][-1:]
    hits = kv.prefix_cache_hits
    assert _run(llm, PROMPTS[-1:], a) == want["a"][-1:]  # the base model's blocks are not a's
    assert kv.prefix_cache_hits == hits
    assert _run(llm, PROMPTS[-1:], a) == want["a"][-1:]
    assert kv.prefix_cache_hits >= hits + 32  # a's own blocks are


def test_bad_adapters_are_refused_and_the_engine_goes_on(folders, tmp_path):
    llm = _llm(folders)
    with pytest.raises(ValueError, match="rank 32, above max_lora_rank=16"):
        _run(llm, PROMPTS[:1], _lora(folders, "big", 3))
    shutil.copytree(folders[1]["b"], tmp_path / "head")
    weights = tmp_path / "head" / "adapter_model.safetensors"
    tensors = safetensors.torch.load_file(weights)
    safetensors.torch.save_file({k.replace("model.layers.0.self_attn.q_proj", "lm_head"): t
                                 for k, t in tensors.items()}, weights)
    with pytest.raises(ValueError, match="adapts lm_head, which is not a linear layer"):
        _run(llm, PROMPTS[:1], LoRARequest("head", 4, str(tmp_path / "head")))
    with pytest.raises(ValueError, match="no adapter_config.json"):
        _run(llm, PROMPTS[:1], LoRARequest("gone", 5, str(tmp_path / "nothing")))
    shutil.copytree(folders[1]["b"], tmp_path / "dora")
    cfg = (tmp_path / "dora" / "adapter_config.json")
    cfg.write_text(cfg.read_text().replace('"use_dora": false', '"use_dora": true'))
    with pytest.raises(ValueError, match="DoRA"):
        _run(llm, PROMPTS[:1], LoRARequest("dora", 6, str(tmp_path / "dora")))
    assert _run(llm, PROMPTS[:2], _lora(folders, "a", 1)) == folders[2]["a"][:2]
    kv = llm.llm_engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_blocks
    plain = LLM(folders[0], dtype="float32", kv_cache_memory=16 << 20)
    with pytest.raises(ValueError, match="enable_lora=True"):
        _run(plain, PROMPTS[:1], _lora(folders, "a", 1))


def test_engine_lora_api(folders):
    """vLLM's LLMEngine.add_lora / list_loras / remove_lora; max_cpu_loras bounds what stays loaded."""
    engine = _llm(folders, max_loras=1, max_cpu_loras=1).llm_engine
    assert engine.add_lora(_lora(folders, "a", 1)) and engine.list_loras() == {1}
    assert engine.add_lora(_lora(folders, "b", 2)) and engine.list_loras() == {2}  # a, least recently used, went
    assert engine.remove_lora(2) and engine.list_loras() == set()
    assert not engine.remove_lora(2)


def test_an_adapter_deleted_after_eviction_fails_its_request_alone(folders, tmp_path):
    llm = _llm(folders, max_loras=1, max_cpu_loras=1)
    shutil.copytree(folders[1]["a"], tmp_path / "a")
    engine = llm.llm_engine
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    gone = LoRARequest("a", 1, str(tmp_path / "a"))
    engine.add_request("first", {"prompt_token_ids": PROMPTS[0]}, sp, lora_request=gone)
    engine.add_request("second", {"prompt_token_ids": PROMPTS[1]}, sp, lora_request=_lora(folders, "b", 2))
    shutil.rmtree(tmp_path / "a")  # b's load evicted a (one adapter kept): a cannot load again
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert done["first"].outputs[0].finish_reason == "error"
    assert done["second"].outputs[0].token_ids == folders[2]["b"][1]
    assert engine.scheduler.kv.num_free_blocks == engine.scheduler.kv.num_blocks


def test_served_under_their_names(folders, monkeypatch):
    from inflight.entrypoints.openai.server_thread import ServerThread
    from inflight.entrypoints.openai.serving_lora import LoRAModels, parse_lora_module

    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    llm = _llm(folders)
    want = folders[2]
    lora = LoRAModels.from_modules([parse_lora_module(f"a={folders[1]['a']}")])
    with ServerThread(llm.llm_engine, "base", log_stats=False, lora=lora) as srv, \
            httpx.Client(base_url=srv.base_url) as h:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x")
        cards = {m.id: m for m in client.models.list().data}
        assert set(cards) == {"base", "a"} and cards["a"].parent == "base"

        def tokens(model: str, prompt: list[int]) -> list[int]:
            r = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0,
                                          extra_body={"ignore_eos": True, "return_token_ids": True})
            assert r.model == model
            return r.choices[0].token_ids

        assert tokens("a", PROMPTS[0]) == want["a"][0]
        assert tokens("base", PROMPTS[0]) == want[None][0]
        with pytest.raises(openai.NotFoundError):
            tokens("b", PROMPTS[0])
        r = h.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": folders[1]["b"]})
        assert r.status_code == 200, r.text
        assert tokens("b", PROMPTS[1]) == want["b"][1]
        r = h.post("/v1/load_lora_adapter", json={"lora_name": "big", "lora_path": folders[1]["big"]})
        assert r.status_code == 400 and "max_lora_rank" in r.json()["error"]["message"]
        assert h.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": folders[1]["a"]}).status_code == 400
        r = h.post("/v1/load_lora_adapter", json={"lora_name": "", "lora_path": folders[1]["a"]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_name"
        assert h.post("/v1/unload_lora_adapter", json={"lora_name": "b"}).status_code == 200
        assert h.post("/v1/unload_lora_adapter", json={"lora_name": "b"}).status_code == 404
        with pytest.raises(openai.NotFoundError):
            tokens("b", PROMPTS[0])
        assert {m.id for m in client.models.list().data} == {"base", "a"}


def test_lora_module_flags():
    from inflight.entrypoints.openai.serving_lora import parse_lora_module

    assert parse_lora_module("sql=/x/sql") == LoRARequest("sql", 1, "/x/sql")
    assert parse_lora_module('{"name": "sql", "path": "/x", "base_model_name": "m"}').base_model_name == "m"
    for bad in ("sql", "=/x", '{"name": "sql"}'):
        with pytest.raises(ValueError, match="--lora-modules"):
            parse_lora_module(bad)


def test_lora_modules_need_enable_lora(capsys):
    from inflight.entrypoints.cli import main

    assert main(["serve", "--lora-modules", "sql=/x/sql"]) == 2  # before any model is loaded
    assert "--lora-modules needs --enable-lora" in capsys.readouterr().err
