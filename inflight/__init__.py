"""inflight: a continuous-batching LLM inference engine and OpenAI-compatible server."""
from inflight.lora.request import LoRARequest
from inflight.outputs import (ClassificationRequestOutput, CompletionOutput, EmbeddingRequestOutput,
                              PoolingRequestOutput, RequestMetrics, RequestOutput, ScoringRequestOutput)
from inflight.pooling_params import PoolingParams
from inflight.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "PoolingParams", "LoRARequest", "RequestOutput", "CompletionOutput",
           "RequestMetrics", "PoolingRequestOutput", "EmbeddingRequestOutput", "ClassificationRequestOutput",
           "ScoringRequestOutput", "__version__"]


def __getattr__(name: str):
    # Lazy so that `import inflight` (and the pure-Python core) does not pull in torch.
    if name == "LLM":
        from inflight.llm import LLM
        return LLM
    raise AttributeError(name)
