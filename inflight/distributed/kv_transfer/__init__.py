"""Prefill/decode disaggregation: the KV connector (base.py), the Gloo connector and
its transport (gloo_connector.py, gloo_pipe.py, blocks.py). Nothing here is imported
unless ``kv_transfer_config`` is set (config.py alone is torch-free)."""
