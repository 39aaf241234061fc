"""Structured output: constrain a request's tokens to a JSON schema, a regex, a
list of choices or a grammar.

``params`` (no torch) holds what a request asks for; ``manager`` compiles it once
per constraint, off the step thread; ``backend`` wraps the grammar library and each
request's matcher; ``masks`` fills a step's token masks beside the forward pass and
applies them in the sampler. The matcher lives on the request
(``Request.structured_output``): the runner advances it with each sampled token and
the scheduler cuts draft tokens the grammar rejects.
"""
from inflight.structured_output.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
