"""Model building blocks as ops with a plain-torch implementation and per-platform
overrides (``CustomOp``), so model files carry no device branches."""
