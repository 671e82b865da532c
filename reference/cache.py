"""A key/value cache that can be rolled back.

Speculation writes keys and values for tokens that may later be rejected; rolling back is just
moving `length` down, because attention only ever reads entries [0, length). Entries past the
length are dead and are overwritten by the next write.
"""

import torch


def allocate(num_layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int,
             dtype: torch.dtype, device, batch_name: str = "batch"):
    """Zeroed keys and values, one [batch, kv_heads, capacity, head_dim] tensor per layer each
    (also the storage of fast.cache.StaticCache, whose batch is its max_batch)."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    if batch < 1:
        raise ValueError(f"{batch_name} must be >= 1, got {batch}")
    shape = (batch, kv_heads, capacity, head_dim)
    keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
    values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
    return keys, values


class KVCache:
    def __init__(self, num_layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype = torch.float32, device=None):
        self.keys, self.values = allocate(num_layers, batch, kv_heads, head_dim, capacity, dtype,
                                          device)
        self.capacity = capacity
        self.length = 0  # committed entries; the model advances it after a forward

    def check_room(self, new_tokens: int) -> None:
        if self.length + new_tokens > self.capacity:
            raise ValueError(f"cache capacity exceeded: writing {new_tokens} tokens at length "
                             f"{self.length} needs {self.length + new_tokens} > capacity {self.capacity}")

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v [B, kv_heads, T, head_dim] at [length, length + T); return all live entries."""
        end = self.length + k.shape[2]
        self.check_room(k.shape[2])
        self.keys[layer][:, :, self.length:end] = k
        self.values[layer][:, :, self.length:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, new_tokens: int) -> None:
        self.check_room(new_tokens)
        self.length += new_tokens

    def truncate(self, n: int) -> None:
        """Keep the first n entries. Truncation only shrinks: growing would expose dead entries."""
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError(f"truncate length n must be an int, got {type(n).__name__}")
        if n < 0 or n > self.length:
            raise ValueError(f"cannot truncate cache to n={n}: it holds length={self.length} entries "
                             f"(n must be in [0, {self.length}])")
        self.length = n

    def move(self, sources: list[int], start: int) -> None:
        """Copy entries at positions `sources` to start, start + 1, ... (tree verification keeps
        the accepted path this way). Sources must be live; the length is not changed."""
        for s in sources:
            if not 0 <= s < self.length:
                raise ValueError(f"cannot move cache entry {s}: live entries are [0, {self.length})")
        if start < 0 or start + len(sources) > self.length:
            raise ValueError(f"cannot move {len(sources)} entries to start={start}: "
                             f"live entries are [0, {self.length})")
        if not sources:
            return
        index = torch.tensor(sources, dtype=torch.long, device=self.keys[0].device)
        for layer in range(len(self.keys)):
            for store in (self.keys, self.values):
                picked = store[layer].index_select(2, index)  # copy before writing: ranges may overlap
                store[layer][:, :, start:start + len(sources)] = picked
