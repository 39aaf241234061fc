"""Low-bit panels for fp32 weights that are 4-, 6- or 8-bit underneath (panel_lowbit.py,
csrc/panel_lowbit.h): a GGUF Q4_0 / Q4_1 / Q8_0 / K-quant / Q5 weight, dequantized as the loader does, is
recovered exactly, and the GEMMs over its low-bit panels (plain, SiLU epilogue, argmax)
give the fp32 panel GEMM's outputs bit for bit at every ISA level the machine can run
(the emulated AVX-512 one too: 48-column panels)."""
import ctypes

import numpy as np
import pytest
import torch

from inflight.kernels.cpu import isa
from inflight.kernels.cpu.gemm_f32 import PanelLinearF32, load_gemm_f32
from inflight.kernels.cpu.lowbit_rows import lowbit_linears, set_max_rows
from inflight.kernels.cpu.panel_lowbit import LOWBIT_MAX_ROWS, pack_panels_lowbit
from tests.isa_levels import kernel_test_levels, level_id

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize, quantize  # noqa: E402

LEVELS = [pytest.param(lv, id=level_id(lv)) for lv in kernel_test_levels()]
AVX2_X86 = isa.machine_arch() == "x86_64" and "avx2" in isa.cpu_flags()


def gguf_weight(n: int, k: int, kind: str = "Q4_1", seed: int = 0) -> torch.Tensor:
    """A weight through GGUF quantization and back, as the loader dequantizes it."""
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    t = getattr(gguf.GGMLQuantizationType, kind)
    return torch.from_numpy(np.ascontiguousarray(dequantize(quantize(w, t), t), dtype=np.float32))


# where each K-quant block (256 values) keeps its half-float scales (ggml's layouts)
HALF_FLOATS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def k_quant_weight(kind: str, n: int, k: int, seed: int = 0) -> torch.Tensor:
    """A GGUF K-quant weight (gguf-py has no K-quant quantizer): random super-blocks of 256
    values (random q and sub-block scales, half-float scales in a sane range), dequantized by
    gguf-py as the loader does."""
    rng = np.random.default_rng(seed)
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    blocks, size = n * k // 256, gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, (blocks, size), dtype=np.uint8)
    for at in HALF_FLOATS[kind]:
        raw[:, at:at + 2] = rng.uniform(1e-3, 2e-2, blocks).astype(np.float16).view(np.uint8).reshape(blocks, 2)
    return torch.from_numpy(np.ascontiguousarray(dequantize(raw, qtype).reshape(n, k)))


def test_every_native_level_is_listed():
    if AVX2_X86:
        assert {"scalar", "avx2"} <= {p.values[0].name for p in LEVELS}


@pytest.mark.parametrize("kind,bits", [("Q4_0", 4), ("Q4_1", 4), ("Q8_0", 8)])
def test_recovers_gguf_weights_exactly(kind, bits):
    w = gguf_weight(300, 96, kind)  # past the sample of rows looked at first
    lin = PanelLinearF32(w, None, lowbit=False)
    qp, found = pack_panels_lowbit(w, lin.packed, lin.panel, lin.lib)
    assert found == bits and qp.numel() == lin.packed.numel() * (0.75 if bits == 4 else 1.125)  # bytes a weight
    back = torch.empty_like(lin.packed)
    assert lin.lib.gemm_f32_lowbit_dequant(qp.data_ptr(), bits, lin.packed.shape[0], 96, back.data_ptr()) == 0
    assert torch.equal(back, lin.packed)


@pytest.mark.parametrize("level", LEVELS)
def test_q4_k_weights_take_the_4_bit_form(level):
    """llama.cpp's K-quants: a block's scale and offset are a half float times a 6-bit integer and
    its values need not reach q = 0 or 15; the 4-bit panels still give the fp32 GEMM bit for bit."""
    w = k_quant_weight("Q4_K", 300, 512, seed=5)  # past the sample of rows looked at first
    fast, plain = PanelLinearF32(w, None, level), PanelLinearF32(w, None, level, lowbit=False)
    assert fast.lowbit_bits == 4
    fast.lowbit_max_rows = 1 << 30
    for rows in [1, 2, 5, 40]:
        x = torch.randn(rows, 512)
        assert torch.equal(fast(x), plain(x)), rows


def k_quant_form_weight(kind: str, n: int, k: int) -> torch.Tensor:
    """A weight of GGUF type ``kind``, or (kind "Q4_K+Q6_K") Q4_K rows over Q6_K ones, as a
    Q4_K_M file's fused qkv has them."""
    if kind == "Q4_K+Q6_K":
        return torch.cat([k_quant_weight("Q4_K", n // 2, k), k_quant_weight("Q6_K", n // 2, k, seed=1)])
    return k_quant_weight(kind, n, k, seed=11) if kind.endswith("_K") else gguf_weight(n, k, kind, seed=11)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", ["Q6_K", "Q4_K+Q6_K", "Q5_K", "Q5_0", "Q5_1", "Q3_K", "Q2_K"])
def test_k_quant_form_is_the_fp32_gemm_bit_for_bit(level, kind):
    """What the 4- and 8-bit forms cannot hold (a scale for every 16 inputs, 5-bit q, or rows of
    both kinds in one fused weight) takes the K-quant form (1.5 bytes a weight), whose GEMM, SiLU
    epilogue and argmax give the fp32 panels' outputs bit for bit, for one or two rows (several
    panels at once) and more."""
    half = 8 * load_gemm_f32(level).gemm_f32_panel()  # gate | up on a panel boundary
    w = k_quant_form_weight(kind, 2 * half, 256)
    fast, plain = PanelLinearF32(w, None, level), PanelLinearF32(w, None, level, lowbit=False)
    assert fast.lowbit_bits == 6 and fast.lowbit.numel() == 1.5 * plain.packed.numel()
    back = torch.empty_like(plain.packed)
    assert fast.lib.gemm_f32_lowbit_dequant(fast.lowbit.data_ptr(), 6, back.shape[0], 256, back.data_ptr()) == 0
    assert torch.equal(back, plain.packed)
    fast.lowbit_max_rows = 1 << 30
    for rows in [1, 2, 5, 40]:
        x = torch.randn(rows, 256)
        assert torch.equal(fast(x), plain(x)), rows
        assert torch.equal(fast.silu_mul(x), plain.silu_mul(x)), rows
        assert torch.equal(fast.argmax(x), plain.argmax(x)), rows


def test_other_weights_have_no_lowbit_form():
    def form(w):
        lin = PanelLinearF32(w, None, lowbit=False)
        return pack_panels_lowbit(w, lin.packed, lin.panel, lin.lib)

    assert form(torch.randn(16, 64)) is None  # plain fp32
    assert form(torch.randn(300, 64)) is None  # and past the sample
    assert form(gguf_weight(16, 64)[:, :40].contiguous()) is None  # K not a multiple of 32
    w = gguf_weight(16, 64)
    w[3, 17] = w[3, 17] + 1e-3  # one value off its block's grid
    assert form(w) is None
    w = gguf_weight(400, 64, "Q8_0")
    w[350, 5] *= 1.0001  # past the sample of rows
    assert form(w) is None


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind,bits", [("Q4_1", 4), ("Q4_0", 4), ("Q8_0", 8)])
def test_lowbit_gemm_is_the_fp32_gemm_bit_for_bit(level, kind, bits):
    torch.manual_seed(0)
    # N off and on the panels, K over one L1 chunk; N of many panels: a row or two takes several at once
    for n, k in [(100, 64), (96, 96), (50, 1088), (1000, 64)]:
        w, bias = gguf_weight(n, k, kind, seed=n), torch.randn(n)
        fast, plain = PanelLinearF32(w, bias, level), PanelLinearF32(w, bias, level, lowbit=False)
        fast.lowbit_max_rows = 1 << 30  # every row count through the low-bit panels
        assert fast.lowbit_bits == bits and plain.lowbit is None
        for rows in [1, 2, 3, 7, 13, 97, 200]:
            x = torch.randn(rows, k)
            assert torch.equal(fast(x), plain(x)), (n, k, rows)
            wide = torch.randn(rows, k + 5)[:, :k]  # rows further apart than K
            assert torch.equal(fast(wide), plain(wide.contiguous())), (n, k, rows)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_lowbit_argmax_is_bit_identical(level, kind):
    """The logits projection's greedy argmax (and with a grammar's mask) over low-bit panels."""
    from inflight.structured_output.masks import GrammarBitmask

    w = gguf_weight(1000, 64, kind, seed=7)  # panels enough for a row to take several at once
    fast, plain = PanelLinearF32(w, None, level), PanelLinearF32(w, None, level, lowbit=False)
    fast.lowbit_max_rows = 1 << 30
    assert fast.lowbit is not None
    for rows in [1, 2, 3, 9]:  # one register block of rows (weights expanded in registers), and more
        x = torch.randn(rows, 64)
        assert torch.equal(fast.argmax(x), plain.argmax(x)), rows
        bitmask = torch.randint(-2**31, 2**31 - 1, (rows, 32), dtype=torch.int32)
        grammar = GrammarBitmask(bitmask=bitmask, rows=list(range(0, rows, 2)))
        assert torch.equal(fast.argmax(x, grammar), plain.argmax(x, grammar)), rows


@pytest.mark.parametrize("level", LEVELS)
def test_q4_silu_gate_up_is_bit_identical(level):
    lib = load_gemm_f32(level)
    inter = 16 * lib.gemm_f32_panel()  # gate and up split on a panel boundary; a row takes several at once
    w = gguf_weight(2 * inter, 128, seed=3)
    fast, plain = PanelLinearF32(w, None, level), PanelLinearF32(w, None, level, lowbit=False)
    fast.lowbit_max_rows = 1 << 30
    assert fast.lowbit is not None
    for rows in [1, 2, 6, 50]:
        x = torch.randn(rows, 128)
        assert torch.equal(fast.silu_mul(x), plain.silu_mul(x)), rows


def test_rows_past_the_limit_use_the_fp32_panels():
    w = gguf_weight(64, 64)
    lin = PanelLinearF32(w, None)
    assert lin.lowbit_max_rows == LOWBIT_MAX_ROWS  # until lowbit_rows.py measures this machine's
    calls = []
    real = lin.lib

    class Spy:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(real, name)

    lin.lib = Spy()
    lin(torch.randn(LOWBIT_MAX_ROWS, 64))
    lin(torch.randn(LOWBIT_MAX_ROWS + 1, 64))
    lin.lowbit_max_rows = 5
    lin(torch.randn(5, 64))
    lin(torch.randn(6, 64))
    assert calls == ["gemm_f32_q4", "gemm_f32", "gemm_f32_q4", "gemm_f32"]
    assert lin.lowbit_bits == 4


def test_a_weight_whose_expansion_differs_is_kept_in_fp32():
    w = gguf_weight(32, 64)
    lin = PanelLinearF32(w, None, lowbit=False)
    wrong = lin.packed.clone()
    wrong.view(-1)[5] += 1.0  # stands for a kernel whose expansion would not match
    assert pack_panels_lowbit(w, wrong, lin.panel, lin.lib) is None
    qp, bits = pack_panels_lowbit(w, lin.packed, lin.panel, lin.lib)
    assert bits == 4 and ctypes.sizeof(ctypes.c_float) * lin.packed.numel() > 5 * qp.numel()


@pytest.mark.slow
def test_the_embedded_model_generates_the_same_over_fp32_panels(monkeypatch):
    """SmolLM2's Q4_1 layers and Q8_0 logits projection get low-bit panels, and every step
    through them (prefill chunks and decodes, the C layer loop; greedy through the fused
    argmax, and with logprobs through the logits and the sampler) gives the tokens and
    logprobs of the same steps over the fp32 panels."""
    from inflight import LLM, SamplingParams

    monkeypatch.setenv("INFLIGHT_LOWBIT_MAX_ROWS", "64")  # every step below, whatever this machine measures
    llm = LLM(dtype="float32", max_num_batched_tokens=64)
    model = llm.llm_engine.runner.model
    assert model.layer_loop.dims.lowbit_max_rows == 64
    bits = [m.lowbit_bits for m in model.modules() if isinstance(m, PanelLinearF32)]
    assert bits.count(4) == 4 * len(model.layer_plan().layers) and bits.count(8) == 1, bits
    assert model.layer_loop is not None
    prompts = ["The capital of France is", "def fibonacci(n):\n    ", "Lighthouse keepers. " * 20 + "Their names"]

    def run():
        got = []
        for logprobs in (None, 3):
            params = SamplingParams(temperature=0, max_tokens=12, logprobs=logprobs)
            outs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
            llm.llm_engine.scheduler.kv.reset_prefix_cache()
            got += [(o.token_ids, [{t: lp.logprob for t, lp in s.items()} for s in o.logprobs or []]) for o in outs]
        return got

    low = run()
    set_max_rows(lowbit_linears(model), -1)
    model.layer_loop.dims.lowbit_max_rows = -1
    assert run() == low


@pytest.fixture(scope="module")
def k_quant_qwen3(tmp_path_factory):
    """A tiny Qwen3 folder whose layers hold a Q4_K_M file's forms: q, k, o, gate and up Q4_K,
    v and down Q6_K, so the fused qkv has rows of both (each weight scaled by a power of two,
    which keeps its form)."""
    import transformers

    from inflight.loader.testing import tiny_model, write_tiny_gguf

    folder = tmp_path_factory.mktemp("qwen3_q4_k_m")
    write_tiny_gguf(str(folder / "tok.gguf"), None)
    transformers.AutoTokenizer.from_pretrained(folder, gguf_file="tok.gguf").save_pretrained(folder)
    model = tiny_model("qwen3", seed=5)
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            if p.dim() == 2 and ".layers." in name:
                w = k_quant_weight("Q6_K" if "v_proj" in name or "down_proj" in name else "Q4_K", *p.shape, seed=i)
                p.copy_(w * 2.0 ** -round(float(torch.log2(w.std() / 0.05))))
    model.save_pretrained(folder)
    return str(folder)


def test_k_quant_layers_generate_the_same_over_fp32_panels(k_quant_qwen3, monkeypatch):
    """Through the C layer loop, a Q4_K_M-shaped model's steps over its 4-bit and K-quant
    panels give the tokens and logprobs of the same steps over the fp32 panels."""
    from inflight import LLM, SamplingParams

    monkeypatch.setenv("INFLIGHT_LOWBIT_MAX_ROWS", "64")
    llm = LLM(model=k_quant_qwen3, dtype="float32", kv_cache_memory=16 << 20, max_num_seqs=4,
              max_num_batched_tokens=16, enable_prefix_caching=False)
    model = llm.llm_engine.runner.model
    assert model.layer_loop is not None and model.layer_loop.dims.lowbit_max_rows == 64
    for layer in model.layers:
        forms = [lin.lowbit_bits for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                             layer.mlp.gate_up_proj, layer.mlp.down_proj)]
        assert forms == [6, 4, 4, 6], forms
    prompts = [[5 + (i * 7 + j * 13) % 250 for j in range(6 + 11 * i)] for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=3)

    def run():
        outs = [o.outputs[0] for o in llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)]
        return [(o.token_ids, [{t: lp.logprob for t, lp in s.items()} for s in o.logprobs]) for o in outs]

    low = run()
    set_max_rows(lowbit_linears(model), -1)
    model.layer_loop.dims.lowbit_max_rows = -1
    assert run() == low

