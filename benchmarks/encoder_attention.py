"""An encoder's attention alone, bf16 on the CPU: the C kernel (encoder_attention_bf16) against
the torch paths it replaced (batched bf16 GEMMs around softmax; torch's fused SDPA), on
shapes of the encoders served (bge-base: 12 heads of 64; MiniLM: 12 heads of 32).

    .venv/bin/python benchmarks/encoder_attention.py [--repeats 20]
    .venv/bin/python benchmarks/encoder_attention.py --embed ~/.cache/inflight-peers/bert-base-shape-hf

Prints the median ms per call (one layer's attention over a step of N requests of L tokens)
and the GFLOP/s over the two products (4 L^2 D per head and request). With --embed FOLDER
(an encoder, e.g. from peers/make_bert_folder.py): LLM.encode (its pooling task) over --docs random texts of
--doc-tokens tokens in bf16, the kernel on and off (the torch paths) in alternating rounds.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from inflight.kernels.cpu.encoder_attention import load_encoder_attention

SHAPES = [  # (requests, tokens each, heads, head dim): a step's documents, pairs or queries
    (16, 300, 12, 64), (4, 500, 12, 64), (32, 20, 12, 64), (16, 260, 12, 32), (64, 40, 12, 32)]


def torch_gemms(q, k, v, starts, lens, scale):
    """The bf16 path before the kernel: per request, two batched GEMMs around torch's softmax."""
    out = torch.empty_like(q)
    zero = q.new_zeros(1)
    for s, n in zip(starts, lens):
        a, b, c = q[:, s:s + n], k[:, s:s + n], v[:, s:s + n]
        scores = torch.baddbmm(zero, a, b.transpose(1, 2), beta=0, alpha=scale)
        out[:, s:s + n] = torch.bmm(torch.softmax(scores, -1), c)
    return out.transpose(0, 1).reshape(q.shape[1], -1)


def torch_sdpa(q, k, v, starts, lens, scale):
    out = torch.empty_like(q)
    for s, n in zip(starts, lens):
        out[:, s:s + n] = F.scaled_dot_product_attention(q[None, :, s:s + n], k[None, :, s:s + n],
                                                         v[None, :, s:s + n])[0]
    return out.transpose(0, 1).reshape(q.shape[1], -1)


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def embed_ab(folder: str, docs: int, doc_tokens: int, rounds: int) -> None:
    """Whole embedding runs with the kernel and without (the layer's torch paths), alternating."""
    from inflight import LLM
    from inflight.layers import encoder_attention

    llm = LLM(folder, dtype="bfloat16")
    gen = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(100, 7000, (doc_tokens - i % 64,), generator=gen).tolist()}
               for i in range(docs)]
    kernel = encoder_attention.cpu_encoder_attention
    times: dict[str, list[float]] = {"kernel": [], "torch": []}
    llm.encode(prompts[:8], use_tqdm=False)
    for r in range(rounds):
        for name in (("kernel", "torch") if r % 2 == 0 else ("torch", "kernel")):
            encoder_attention.cpu_encoder_attention = kernel if name == "kernel" else (lambda: None)
            t0 = time.perf_counter()
            llm.encode(prompts, use_tqdm=False)
            times[name].append(time.perf_counter() - t0)
    encoder_attention.cpu_encoder_attention = kernel
    for name, ts in times.items():
        print(f"{name:<7} {docs / statistics.median(ts):7.1f} docs/s  (runs: {', '.join(f'{t:.2f} s' for t in ts)})")
    print(f"kernel / torch: {statistics.median(times['torch']) / statistics.median(times['kernel']):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--embed", default=None, help="an encoder folder: whole LLM.embed runs, kernel on and off")
    ap.add_argument("--docs", type=int, default=128)
    ap.add_argument("--doc-tokens", type=int, default=300, help="the longest text; each is up to 63 shorter")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.embed:
        return embed_ab(args.embed, args.docs, args.doc_tokens, args.rounds)
    kernel = load_encoder_attention()
    if kernel is None:
        raise SystemExit("the C kernel did not build")
    print(f"{'shape (N x L, H x D)':<24}{'C kernel':>18}{'bf16 GEMMs':>18}{'SDPA':>18}{'GEMMs / C':>11}")
    for n, length, heads, d in SHAPES:
        torch.manual_seed(0)
        qkv = torch.randn(n * length, 3 * heads, d).bfloat16()
        q, k, v = (t.transpose(0, 1) for t in qkv.split([heads] * 3, dim=1))
        starts, lens, scale = [i * length for i in range(n)], [length] * n, d ** -0.5
        flops = 4.0 * length * length * d * heads * n
        row = [median_ms(lambda f=f: f(q, k, v, starts, lens, scale), args.repeats)
               for f in (kernel, torch_gemms, torch_sdpa)]
        cells = "".join(f"{ms:>9.2f} ({flops / ms / 1e6:>5.0f})" for ms in row)
        print(f"{f'{n} x {length}, {heads} x {d}':<24}{cells}{row[1] / row[0]:>10.2f}x")


if __name__ == "__main__":
    main()
