"""The KV cache manager: a pool of fixed-size blocks, a block table per request, and the prefix cache.

The device memory is a pool of ``num_blocks`` blocks of ``block_size`` tokens per layer (``model.Qwen2Engine``'s
``cache_k`` / ``cache_v``); this class only does the bookkeeping, on the host, so that every executor (local,
tensor-parallel ranks, the CUDA fast path) reads the same block tables. A request's table lists the blocks that
hold its positions in order: position ``p`` lives in block ``table[p // block_size]`` at offset
``p % block_size``. Block 0 is the null block: never handed out, it is where padding rows and padded positions
write, so that no step needs a branch for them (vLLM keeps one the same way).

The prefix cache (``enable_prefix_cache``; TensorRT-LLM's ``enable_kv_cache_reuse``): every FULL block gets a key,
a hash of all the tokens up to its end (chained: the parent block's key and this block's tokens), once its K/V
are written (``commit``). A later request whose prompt starts with the same tokens takes those blocks instead of
computing them (``admit``): the block is shared (reference counts), never written again (a request writes only at
positions past its shared prefix, which end on a block boundary). A block whose last reference goes keeps its key
and its K/V and waits, least recently used first, until the pool needs it; only then is it evicted (its key
forgotten) and reused. Without the prefix cache, blocks go straight back to the free list.
"""

from __future__ import annotations

import collections
import hashlib
from array import array
from typing import Any, Iterable, Sequence

NULL_BLOCK = 0
_ROOT = b"trtllm-pipeline-kv"


def block_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The chained key of a full block: its parent's key and its own tokens (equal keys, equal prefixes)."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()


class KVCacheManager:
    """Blocks ``1 .. num_blocks - 1`` for requests (block 0 is the null block); see the module docstring."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_cache: bool = False, watermark: float = 0.01):
        if num_blocks < 2 or block_size < 1:
            raise ValueError(f"a KV pool needs >= 2 blocks of >= 1 token (got {num_blocks} of {block_size})")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_cache = enable_prefix_cache
        # blocks kept free at admission, so that running requests can grow a while before one is preempted
        self.watermark_blocks = int(watermark * (num_blocks - 1))
        self.ref = [0] * num_blocks
        self.key: list[bytes | None] = [None] * num_blocks  # a cached full block's key, else None
        self.cached: dict[bytes, int] = {}  # key -> block holding it
        self._free: collections.deque[int] = collections.deque(range(1, num_blocks))  # no key: taken first
        self._evictable: collections.OrderedDict[int, None] = collections.OrderedDict()  # keyed, ref 0, LRU first
        self.tables: dict[Any, list[int]] = {}
        self._keys: dict[Any, list[bytes]] = {}  # each request's full blocks' keys, in order
        # keys of full prompt blocks a running request will compute (admitted, not yet committed) -> that request
        self.pending: dict[bytes, Any] = {}
        self._pending_of: dict[Any, list[bytes]] = {}
        self.queries = self.hits = self.preemptions = 0

    # ---- capacity -------------------------------------------------------------------------------

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def free_blocks(self) -> int:
        """Blocks a request could take now: never used, or cached with no reference (evicted on demand)."""
        return len(self._free) + len(self._evictable)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def fits_ever(self, tokens: int) -> bool:
        """Whether a request of ``tokens`` positions fits the whole pool (if it were alone)."""
        return self.blocks_for(tokens) <= self.usable_blocks

    # ---- requests -------------------------------------------------------------------------------

    def prefix_keys(self, tokens: Sequence[int]) -> list[bytes]:
        """The chained keys of ``tokens``' full blocks, in order."""
        keys, parent = [], _ROOT
        for i in range(len(tokens) // self.block_size):
            parent = block_key(parent, tokens[i * self.block_size : (i + 1) * self.block_size])
            keys.append(parent)
        return keys

    def cached_prefix(self, tokens: Sequence[int], keys: Sequence[bytes] | None = None) -> list[int]:
        """The cached blocks holding ``tokens``' longest block-aligned prefix (no references taken); ``keys``:
        ``prefix_keys(tokens)`` where the caller has them."""
        found = []
        for key in self.prefix_keys(tokens) if keys is None else keys:
            block = self.cached.get(key)
            if block is None:
                break
            found.append(block)
        return found

    def waits_for_prefix(self, keys: Sequence[bytes]) -> bool:
        """Whether the first of these block keys that is not cached is one a running request is computing now
        (``pending``): a request with that prefix admitted now would compute the same blocks side by side; a step
        or a chunk later it takes them from the cache (SGLang calls this in-batch prefix caching)."""
        for key in keys:
            if key not in self.cached:
                return key in self.pending
        return False

    def admit(self, request_id: Any, tokens: Sequence[int], reserve: int, *, use_cache: bool | None = None,
              watermark: bool = True, keys: Sequence[bytes] | None = None) -> int | None:
        """Start ``request_id`` with blocks for ``reserve`` positions, reusing cached blocks of ``tokens``' prefix
        (``use_cache``: default the manager's setting; ``keys``: ``prefix_keys(tokens[:-1])`` where the caller has
        them). Returns how many tokens are already computed (a multiple of the block size, and at most
        ``len(tokens) - 1``, so that the last token is run for its logits), or None if the blocks are not free now
        (nothing is changed then). The full blocks it will compute become ``pending`` until committed."""
        if request_id in self.tables:
            raise ValueError(f"request {request_id!r} already holds blocks")
        use_cache = self.enable_prefix_cache if use_cache is None else use_cache
        if use_cache and keys is None:
            keys = self.prefix_keys(tokens[: len(tokens) - 1])
        hit = self.cached_prefix(tokens, keys) if use_cache else []
        need = self.blocks_for(reserve) - len(hit)
        # cached blocks with no reference are counted free: taking them must not count twice
        taken_from_free = sum(1 for b in hit if self.ref[b] == 0)
        if need + taken_from_free > self.free_blocks - (self.watermark_blocks if watermark else 0):
            return None
        if use_cache:
            self.queries += len(tokens)
            self.hits += len(hit) * self.block_size
        for block in hit:
            self._take(block)
        self.tables[request_id] = list(hit) + [self._allocate() for _ in range(max(0, need))]
        self._keys[request_id] = [self.key[b] for b in hit]
        if use_cache:
            mine = [k for k in keys[len(hit):] if k not in self.pending and k not in self.cached]
            self.pending.update(dict.fromkeys(mine, request_id))
            self._pending_of[request_id] = mine
        return len(hit) * self.block_size

    def grow(self, request_id: Any, positions: int) -> bool:
        """Blocks for ``positions`` positions in ``request_id``'s table; False (nothing changed) when the pool
        has too few free."""
        table = self.tables[request_id]
        need = self.blocks_for(positions) - len(table)
        if need <= 0:
            return True
        if need > self.free_blocks:
            return False
        table.extend(self._allocate() for _ in range(need))
        return True

    def trim(self, request_id: Any, positions: int) -> None:
        """Speculation's rollback: blocks of ``request_id``'s table past the first ``positions`` positions go back
        (they hold only rejected drafts' K/V: never keyed, never shared; the tail's partial block stays, its
        rejected positions simply written again)."""
        table = self.tables[request_id]
        keep = max(self.blocks_for(positions), len(self._keys[request_id]))
        while len(table) > keep:
            self._release(table.pop())

    def commit(self, request_id: Any, tokens: Sequence[int], *, use_cache: bool | None = None) -> None:
        """``tokens`` (the request's, from position 0) have their K/V written: key the full blocks among them."""
        if not (self.enable_prefix_cache if use_cache is None else use_cache):
            return
        table, keys = self.tables[request_id], self._keys[request_id]
        parent = keys[-1] if keys else _ROOT
        for i in range(len(keys), min(len(tokens) // self.block_size, len(table))):
            parent = block_key(parent, tokens[i * self.block_size : (i + 1) * self.block_size])
            keys.append(parent)
            if self.pending.get(parent) == request_id:
                del self.pending[parent]
            block = table[i]
            if parent not in self.cached and self.key[block] is None:
                self.cached[parent] = block
                self.key[block] = parent
            # else: the same tokens are cached in another block already (computed side by side): this one stays
            # unkeyed and is freed as an ordinary block

    def free(self, request_id: Any) -> None:
        """Release ``request_id``'s blocks (the tail first, so that the prefix's blocks are evicted last)."""
        for block in reversed(self.tables.pop(request_id, [])):
            self._release(block)
        self._keys.pop(request_id, None)
        for key in self._pending_of.pop(request_id, []):
            if self.pending.get(key) == request_id:
                del self.pending[key]

    def preempted(self, request_id: Any) -> None:
        self.preemptions += 1
        self.free(request_id)

    # ---- blocks ---------------------------------------------------------------------------------

    def _take(self, block: int) -> None:
        if self.ref[block] == 0:
            del self._evictable[block]
        self.ref[block] += 1

    def _release(self, block: int) -> None:
        self.ref[block] -= 1
        if self.ref[block] == 0:
            if self.key[block] is not None:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def _allocate(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:  # the least recently used cached block with no reference: its key goes
            block, _ = self._evictable.popitem(last=False)
            del self.cached[self.key[block]]
            self.key[block] = None
        self.ref[block] = 1
        return block

    # ---- what it holds --------------------------------------------------------------------------

    def stats(self) -> dict[str, float | int]:
        """``kv_cache_usage`` (referenced blocks / usable), prefix-cache tokens queried and hit, preemptions."""
        used = self.usable_blocks - self.free_blocks
        return {"kv_cache_usage": used / self.usable_blocks, "prefix_cache_queries": self.queries,
                "prefix_cache_hits": self.hits, "preemptions": self.preemptions}

    def check(self) -> None:
        """Assert the allocator's invariants (tests): every block free, evictable or referenced exactly as often
        as tables list it; shared blocks only cached full blocks with the same key chain."""
        counts = collections.Counter(b for table in self.tables.values() for b in table)
        assert NULL_BLOCK not in counts and self.ref[NULL_BLOCK] == 0, "the null block was handed out"
        free, evictable = set(self._free), set(self._evictable)
        assert len(free) == len(self._free) and not free & evictable, "a block is free twice"
        for block in range(1, self.num_blocks):
            assert self.ref[block] == counts.get(block, 0), f"block {block}: ref {self.ref[block]}, tables {counts[block]}"
            listed = (block in free) + (block in evictable) + (self.ref[block] > 0)
            assert listed == 1, f"block {block} is in {listed} of free / evictable / used"
            assert (block in evictable) <= (self.key[block] is not None), f"block {block} evictable without a key"
            assert (block in free) <= (self.key[block] is None), f"block {block} free with a key"
        assert len(free) + len(evictable) + sum(1 for r in self.ref if r > 0) == self.usable_blocks
        for key, block in self.cached.items():
            assert self.key[block] == key, f"cached key of block {block} disagrees"
        for key, rid in self.pending.items():
            assert rid in self.tables and key not in self._keys[rid], f"pending key of {rid!r} that is not computing it"
        for rid, table in self.tables.items():
            for i, block in enumerate(table):
                if counts[block] > 1:  # shared: a full prefix block, whose key is this request's own chain
                    keys = self._keys[rid]
                    assert i < len(keys) and self.key[block] == keys[i], f"block {block} shared but not as a prefix"


def tables_padded(tables: Iterable[Sequence[int]], width: int) -> list[list[int]]:
    """Block tables as rows of ``width`` entries (the null block after each table's own)."""
    return [list(t) + [NULL_BLOCK] * (width - len(t)) for t in tables]
