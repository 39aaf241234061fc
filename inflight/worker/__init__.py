"""Model execution on one device: KV cache, model runner, sampler."""
