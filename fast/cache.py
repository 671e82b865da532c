"""A static, batched key/value cache with a length per row.

Storage is allocated once per layer as [max_batch, kv_heads, capacity, head_dim] and never
reallocated, so a captured CUDA graph can keep pointing at it. A batch of B rows uses the first B
rows of the storage (when rows finish, the live ones are moved to the front: `compact`).

Invariants:
- Row b's live entries are slots [0, lengths[b]); attention never reads a slot at or past a
  row's length except the slots the current call itself writes (the mask in fast/forward.py
  guarantees it), so anything left there by a rejected proposal is dead.
- Rollback is setting `lengths` (no copy); dead entries are overwritten by the next write.
- `lengths` lives on the model's device so that a graph-captured step can read it; the host
  never needs its value inside a round.
"""

import torch

from reference.cache import allocate


class StaticCache:
    def __init__(self, num_layers: int, max_batch: int, kv_heads: int, head_dim: int,
                 capacity: int, dtype: torch.dtype, device):
        self.keys, self.values = allocate(num_layers, max_batch, kv_heads, head_dim, capacity,
                                          dtype, device, batch_name="max_batch")
        self.max_batch, self.capacity = max_batch, capacity
        self.lengths = torch.zeros(max_batch, dtype=torch.long, device=device)  # [max_batch]

    @property
    def device(self):
        return self.lengths.device

    def write(self, layer: int, rows: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Store k, v [rows, kv_heads, T, head_dim] at per-row slots [rows, T].

        A scatter, not a slice assignment: every row writes at its own offset, and a scatter
        with a device index tensor is safe to capture in a CUDA graph.
        """
        self.write_at(layer, rows, slots[:, None, :, None].expand(k.shape), k, v)

    def write_at(self, layer: int, rows: int, index: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor):
        """write() with the scatter index [rows, kv_heads, T, head_dim] already expanded (a
        forward pass builds it once for all its layers)."""
        self.keys[layer][:rows].scatter_(2, index, k)
        self.values[layer][:rows].scatter_(2, index, v)

    def view(self, layer: int, rows: int, span: int):
        """Keys and values of the first `rows` rows over slots [0, span): [rows, kv_heads, span, D]."""
        return self.keys[layer][:rows, :, :span], self.values[layer][:rows, :, :span]

    def rollback(self, rows: int, new_lengths: torch.Tensor) -> None:
        """Set the first `rows` lengths. Rollback only: the caller keeps lengths within what was written."""
        self.lengths[:rows].copy_(new_lengths)

    def move(self, rows: int, sources: torch.Tensor, start: torch.Tensor) -> None:
        """Copy each row's entries at slots sources [rows, n] to start[b], start[b] + 1, ...

        Tree verification keeps the accepted path this way. The gather copies before the scatter
        writes, so source and destination ranges may overlap.
        """
        n = sources.shape[1]
        targets = start[:, None] + torch.arange(n, device=sources.device)  # [rows, n]
        for store in (self.keys, self.values):
            for layer in range(len(store)):
                live = store[layer][:rows]
                src = sources[:, None, :, None].expand(rows, live.shape[1], n, live.shape[3])
                picked = live.gather(2, src)  # [rows, kv_heads, n, D], a copy
                live.scatter_(2, targets[:, None, :, None].expand_as(src), picked)

    def compact(self, order: torch.Tensor, rows: int) -> None:
        """Make rows order[0..rows) the first `rows` rows (order: a permutation on the device)."""
        keep = order[:rows]
        for store in (self.keys, self.values):
            for layer in range(len(store)):
                store[layer][:rows] = store[layer].index_select(0, keep)  # copy, then write
        self.lengths[:rows] = self.lengths.index_select(0, keep)
