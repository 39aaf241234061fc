"""The prefix cache's block hash (vLLM's ``kv_cache_utils``): what the KV cache manager and
the data-parallel router's prefix-aware routing both key blocks by."""
from __future__ import annotations

import hashlib
import struct
from array import array
from typing import Optional, Sequence

# The parent of a request's first block; any fixed 32 bytes keep every parent the same length.
ROOT_BLOCK_HASH = hashlib.sha256(b"inflight prefix cache root").digest()


def hash_block_tokens(parent_hash: Optional[bytes], token_ids: Sequence[int],
                      extra: Optional[str] = None, lora_name: Optional[str] = None) -> bytes:
    """Chained sha256 of one full block over the parent's hash, the token ids and
    the extra keys (the cache salt, the LoRA adapter's name): equal hashes mean
    equal whole prefixes computed by the same weights.

    NOTE: not Python's hash(): it is the identity on small ints and the same in
    every run, so a client could craft a prompt whose blocks collide with
    another tenant's cached prefix and be served its KV. sha256 costs a few times
    hash() per block: nothing next to a step.
    """
    h = hashlib.sha256(parent_hash if parent_hash is not None else ROOT_BLOCK_HASH)
    # every field length-prefixed and each extra key tagged, so no two inputs serialize to the same bytes
    h.update(struct.pack("<I", len(token_ids)))
    h.update(array("q", token_ids).tobytes())
    for tag, key in ((b"s", extra), (b"l", lora_name)):
        if key is not None:
            data = key.encode("utf-8", "surrogatepass")
            h.update(tag + struct.pack("<I", len(data)) + data)
    return h.digest()


def first_block_keys(cache_salt: Optional[str], lora_name: Optional[str]) -> dict[str, Optional[str]]:
    """The extra keys of a request's first block (the chain carries them to every later one, as vLLM)."""
    return {"extra": cache_salt, "lora_name": lora_name}
