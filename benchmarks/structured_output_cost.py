"""What a JSON schema on every request costs: the chat workload offline (greedy, ignore_eos),
alternating runs without and with a schema that constrains the whole output.

    python benchmarks/structured_output_cost.py --num-requests 16 --rounds 2
"""
from __future__ import annotations

import argparse
import time

from inflight import LLM, SamplingParams
from inflight.bench.workload import generate
from inflight.sampling_params import StructuredOutputsParams

# Open-ended (no maxLength, no maxItems): the grammar stays active until max_tokens.
SCHEMA = {"type": "object", "properties": {"title": {"type": "string"},
                                           "items": {"type": "array", "items": {"type": "string"}}},
          "required": ["title", "items"], "additionalProperties": False}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    llm = LLM()
    reqs = generate("chat", llm.get_tokenizer(), num_requests=args.num_requests)
    chats = [[{"role": "user", "content": r.prompt}] for r in reqs]
    schema = StructuredOutputsParams(json=SCHEMA)
    llm.chat(chats[:2], SamplingParams(max_tokens=2, structured_outputs=schema), use_tqdm=False)  # compile, warm up
    for _ in range(args.rounds):
        for so in (None, schema):
            params = [SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True, structured_outputs=so)
                      for r in reqs]
            cpu, wall = time.process_time(), time.time()
            outs = llm.chat(chats, params, use_tqdm=False)
            n = sum(len(o.outputs[0].token_ids) for o in outs)
            cpu, wall = time.process_time() - cpu, time.time() - wall
            print(f"{'schema' if so else 'plain':6} {n} tokens: {wall:.1f} s wall ({n / wall:.1f} tok/s), "
                  f"{cpu / n * 1e3:.1f} ms CPU per token", flush=True)


if __name__ == "__main__":
    main()
