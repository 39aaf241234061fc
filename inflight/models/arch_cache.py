"""An on-disk memo of the HF-config parser (``hf_config.parse_hf_config``).

The parser asks transformers' config class for the model type to fill in defaults,
and importing that class pulls in ``torch.distributed.tensor`` and sympy on every
start, before the first request, for a result that depends only on
the config dict, the transformers version and this package's model sources
(the parser, the ``ArchSpec``s and their ``check_config``). The memo is keyed by
exactly those, so an edited model file or another transformers parses afresh.
Only successful parses are stored (a refused config raises every time), and a
result is stored only where it reads back equal.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from functools import lru_cache
from importlib import metadata
from typing import Any, Callable, Optional, TypeVar

from inflight.cache_root import cache_root, write_atomic

logger = logging.getLogger(__name__)

T = TypeVar("T")


def cache_dir() -> str:
    """``$INFLIGHT_CACHE_DIR/arch`` (default ``~/.cache/inflight/arch``)."""
    return os.path.join(cache_root(), "arch")


@lru_cache(maxsize=1)
def code_version() -> str:
    """A hash of the transformers version and every source file of ``inflight.models``."""
    h = hashlib.sha256()
    try:
        h.update(metadata.version("transformers").encode())
    except metadata.PackageNotFoundError:
        h.update(b"-")
    root = os.path.dirname(os.path.abspath(__file__))
    for dirpath, dirnames, files in os.walk(root):
        dirnames.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def _entry_path(hf: dict[str, Any]) -> Optional[str]:
    try:
        text = json.dumps(hf, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):  # not a JSON config: parse it every time
        return None
    digest = hashlib.sha256(f"{code_version()}\0{text}".encode()).hexdigest()[:32]
    return os.path.join(cache_dir(), f"{digest}.json")


def memoized(hf: dict[str, Any], parse: Callable[[dict[str, Any]], T], cls: type[T]) -> T:
    """``parse(hf)``, read from the memo where an earlier run stored it (``cls`` is the
    dataclass it returns)."""
    path = _entry_path(hf)
    if path is not None:
        try:
            with open(path) as f:
                return cls(**json.load(f))
        except (OSError, ValueError, TypeError):  # absent, or unreadable: parse afresh
            pass
    result = parse(hf)
    if path is not None:
        _store(path, result, cls)
    return result


def _store(path: str, result: Any, cls: type) -> None:
    data = dataclasses.asdict(result)
    try:
        text = json.dumps(data, allow_nan=False)
        if cls(**json.loads(text)) != result:  # a field JSON cannot carry: keep parsing
            return
        write_atomic(path, text)
    except (OSError, TypeError, ValueError) as exc:
        logger.debug("not memoizing the parsed config: %s", exc)
