"""Where inflight keeps what it derives once per machine: converted weights, built
kernels, parsed configs and measured limits, each in its own folder below one root."""
from __future__ import annotations

import os
from typing import Optional


def cache_root(cache_dir: Optional[str] = None) -> str:
    """``cache_dir``, else ``$INFLIGHT_CACHE_DIR``, else ``~/.cache/inflight``."""
    root = cache_dir or os.environ.get("INFLIGHT_CACHE_DIR") or "~/.cache/inflight"
    return os.path.abspath(os.path.expanduser(root))
