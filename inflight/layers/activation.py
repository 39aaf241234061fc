"""SiLU(gate) * up over the fused gate_up projection's output (vLLM's ``SiluAndMul``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from inflight.kernels.cpu.ops import cpu_fused_ops
from inflight.layers.custom_op import CustomOp


class SiluAndMul(CustomOp):
    """Rows ``[gate | up]`` -> ``silu(gate) * up``."""

    def forward_native(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        # NOTE: SiLU on bfloat16 CPU tensors runs orders of magnitude slower than on
        # float32 in torch; compute it in float32 (exact for float32 models).
        return F.silu(gate.float()).to(gate_up.dtype) * up

    def forward_cpu(self, gate_up: torch.Tensor) -> torch.Tensor:
        ops = cpu_fused_ops(gate_up.dtype)
        if ops is None:
            return self.forward_native(gate_up)
        return ops.silu_mul(gate_up)


class GeluAndMul(CustomOp):
    """Rows ``[gate | up]`` -> ``gelu(gate) * up`` (GeGLU; vLLM's ``GeluAndMul``), with
    ``approximate`` "tanh" for HF's gelu_pytorch_tanh."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward_native(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        # computed in float32 for the same reason as SiluAndMul's
        return F.gelu(gate.float(), approximate=self.approximate).to(gate_up.dtype) * up
