"""Pooling models: embeddings from a decoder's final hidden states (vLLM's ``--runner pooling``)."""
