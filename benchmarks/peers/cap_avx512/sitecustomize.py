"""Put on vLLM's PYTHONPATH by ``compare.py --cap-isa avx512``: vLLM chooses its kernel
library (``vllm._C_AVX512`` where torch's probes find AVX-512 without bf16) and its
attention ISA from those probes, which read the hardware, not ATEN_CPU_CAPABILITY.
Answering them as an AVX-512F CPU without bf16, VNNI or AMX (Skylake-SP's set) would
makes vLLM load and run what it runs on one."""
import torch.cpu

for _probe in ("_is_avx512_bf16_supported", "_is_vnni_supported", "_is_amx_tile_supported",
               "_is_amx_fp16_supported"):
    if hasattr(torch.cpu, _probe):
        setattr(torch.cpu, _probe, lambda: False)
