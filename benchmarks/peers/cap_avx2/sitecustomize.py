"""Put on vLLM's PYTHONPATH by ``compare.py --cap-isa avx2``: vLLM chooses its kernel
library (``vllm._C_AVX2`` or an AVX-512 build) and its attention ISA from torch's CPU
probes, which read the hardware, not ATEN_CPU_CAPABILITY. Answering them as an AVX2+FMA
CPU would makes vLLM load and run what it runs on one."""
import torch.cpu

for _probe in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_vnni_supported",
               "_is_amx_tile_supported", "_is_amx_fp16_supported"):
    if hasattr(torch.cpu, _probe):
        setattr(torch.cpu, _probe, lambda: False)
