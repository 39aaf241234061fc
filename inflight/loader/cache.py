"""On-disk cache of dequantized GGUF models.

One entry is a folder named after the source file and a hash of its resolved
path, size and mtime (so an edited or replaced file gets a new entry)::

    weights.safetensors   float32 HF-named weights (written and read one tensor at a time)
    config.json           the normalised HF-style config
    tokenizer/            tokenizer.save_pretrained output
    meta.json             written last: source identity and every file's size

An entry is built in a temporary sibling folder and renamed into place, so a
killed process leaves at most a stray ``.tmp-*`` folder, never a half-written
entry. An entry whose meta.json is missing or unreadable, or whose files'
sizes differ from it, counts as corrupt: it is removed and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inflight.cache_root import cache_root

from .stream import SafetensorsSource, WeightSource, save_safetensors

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

# Bump whenever the conversion or the entry layout changes, so old entries are ignored.
CACHE_FORMAT_VERSION = 1
WEIGHTS_FILE = "weights.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_DIR = "tokenizer"
META_FILE = "meta.json"


def _identity(source: str) -> dict[str, Any]:
    st = os.stat(source)
    return {
        "format": CACHE_FORMAT_VERSION,
        "source": source,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
    }


def entry_dir(source: str, cache_dir: str | None = None) -> str:
    """The cache folder for ``source`` (a resolved path); it may not exist yet."""
    key = hashlib.sha256(json.dumps(_identity(source), sort_keys=True).encode()).hexdigest()[:16]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(source))[:80]
    return os.path.join(cache_root(cache_dir), f"{stem}-{key}")


@dataclass
class CachedModel:
    hf_config: dict[str, Any]
    weights: SafetensorsSource
    tokenizer_dir: str


def _file_sizes(folder: str) -> dict[str, int]:
    sizes = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            sizes[os.path.relpath(path, folder)] = os.path.getsize(path)
    return sizes


def entry_is_valid(entry: str, source: str) -> bool:
    """True when ``entry`` is complete: meta.json matches ``source`` and every file's size."""
    try:
        with open(os.path.join(entry, META_FILE), encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("identity") != _identity(source):
            return False
        return all(
            os.path.getsize(os.path.join(entry, rel)) == size for rel, size in meta["files"].items()
        )
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return False


def remove_entry(entry: str) -> None:
    """Delete a corrupt entry; renamed away first so no reader sees it half-deleted."""
    if not os.path.exists(entry):
        return
    trash = f"{entry}.trash-{os.getpid()}"
    try:
        os.rename(entry, trash)
    except OSError:
        return  # another process removed or replaced it already
    shutil.rmtree(trash, ignore_errors=True)


def read_entry(entry: str, source: str) -> CachedModel | None:
    """Load a cache entry, or return None (after removing it) when it is absent or corrupt."""
    if not os.path.isdir(entry):
        return None
    if entry_is_valid(entry, source):
        try:
            with open(os.path.join(entry, CONFIG_FILE), encoding="utf-8") as f:
                config = json.load(f)
            weights = SafetensorsSource([os.path.join(entry, WEIGHTS_FILE)])
            return CachedModel(config, weights, os.path.join(entry, TOKENIZER_DIR))
        except Exception as exc:  # a damaged file whose size happens to be right
            logger.warning("cache entry %s unreadable (%s); rebuilding", entry, exc)
    else:
        logger.warning("cache entry %s incomplete or stale; rebuilding", entry)
    remove_entry(entry)
    return None


def _sweep_leftovers(root: str, max_age_s: float = 3600.0) -> None:
    """Remove temp/trash folders that killed processes left behind, once they are old.

    Young ones may belong to a process that is writing right now.
    """
    now = time.time()
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if (name.startswith(".tmp-") or ".trash-" in name) and os.path.isdir(path):
            try:
                if now - os.path.getmtime(path) > max_age_s:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass  # raced with another sweeper


def write_entry(
    entry: str,
    source: str,
    hf_config: dict[str, Any],
    weights: WeightSource,
    tokenizer: "PreTrainedTokenizerBase",
) -> bool:
    """Write an entry atomically, one tensor in memory at a time; return False (and
    log) when the cache is not writable."""
    root = os.path.dirname(entry)
    tmp = None
    try:
        os.makedirs(root, exist_ok=True)
        _sweep_leftovers(root)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=root)
        save_safetensors(os.path.join(tmp, WEIGHTS_FILE), weights)
        with open(os.path.join(tmp, CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(hf_config, f, indent=1, sort_keys=True)
        tokenizer.save_pretrained(os.path.join(tmp, TOKENIZER_DIR))
        meta = {"identity": _identity(source), "files": _file_sizes(tmp)}
        with open(os.path.join(tmp, META_FILE), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)
        # NOTE: never replace a valid entry: a concurrent loader may be reading its weights
        # lazily (data-parallel replicas load one file at once); only a stale or corrupt one
        # that blocks the rename is removed.
        try:
            os.rename(tmp, entry)
        except OSError:
            if entry_is_valid(entry, source):
                return True
            remove_entry(entry)
            os.rename(tmp, entry)
        tmp = None
        return True
    except Exception as exc:  # OSError, SafetensorError, ...; a load never fails for caching
        # Either the cache is not writable (the model still loads, only slower next
        # time) or a concurrent process renamed its own complete entry first.
        if not entry_is_valid(entry, source):
            logger.warning("could not write model cache %s: %s", entry, exc)
        return False
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
