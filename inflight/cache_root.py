"""Where inflight keeps what it derives once per machine: converted weights, built
kernels, parsed configs and measured limits, each in its own folder below one root."""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Optional


def cache_root(cache_dir: Optional[str] = None) -> str:
    """``cache_dir``, else ``$INFLIGHT_CACHE_DIR``, else ``~/.cache/inflight``."""
    root = cache_dir or os.environ.get("INFLIGHT_CACHE_DIR") or "~/.cache/inflight"
    return os.path.abspath(os.path.expanduser(root))


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it, so a concurrent
    reader sees the old file or the whole new one, never half of it; raises OSError
    (and leaves no temporary file) where it cannot."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
