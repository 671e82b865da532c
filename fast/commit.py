"""Committing a verified block per row: stop ids, per-row token budgets, output, rollback.

Vectorized over rows; no host sync. The rules, per row:
- a row that accepted `a` proposals offers block[:a + 1];
- it takes at most its remaining budget max_new - n_out;
- it takes up to and including the first stop id in what it offers, and then it is finished;
- a row that reaches its budget is finished;
- a finished (or already inactive) row's cache length and last tokens stay where they were, so
  its writes in later rounds (until it is compacted away) stay inside its reserved slots.
"""

from dataclasses import dataclass, fields

import torch


@dataclass
class Rows:
    """Device state of the rows in flight; physical row i is original row row_ids[i]."""
    row_ids: torch.Tensor    # [B] long
    last: torch.Tensor       # [B] newest committed token, not yet fed to either model
    prev: torch.Tensor       # [B] the committed token before it (for the draft's catch-up)
    n_out: torch.Tensor      # [B] tokens generated so far
    max_new: torch.Tensor    # [B] per-row budget
    active: torch.Tensor     # [B] bool: still generating

    def select(self, order: torch.Tensor, count: int) -> "Rows":
        keep = order[:count]
        return Rows(**{f.name: getattr(self, f.name).index_select(0, keep) for f in fields(self)})


def commit(rows: Rows, lengths: torch.Tensor, accepted: torch.Tensor, block: torch.Tensor,
           stop_ids: torch.Tensor | None, out: torch.Tensor):
    """Apply one verified block [B, W] with accepted [B] to rows and out [B_all, width].

    Returns (rows after, lengths after [B], take [B], finished [B], continuing [B]).
    """
    B, W = block.shape
    offsets = torch.arange(W, device=block.device)                         # [W]
    offered = accepted + 1                                                 # [B]
    room = rows.max_new - rows.n_out                                       # [B]
    take = torch.minimum(offered, room)
    stopped = torch.zeros_like(rows.active)
    if stop_ids is not None:
        hit = torch.isin(block, stop_ids) & (offsets[None] < offered[:, None])   # [B, W]
        first = hit.to(torch.int8).argmax(1)                               # first stop (0 if none)
        stopped = hit.any(1) & (first < take)
        take = torch.where(stopped, first + 1, take)
    take = torch.where(rows.active, take, 0)
    finished = rows.active & (stopped | (rows.n_out + take >= rows.max_new))
    continuing = rows.active & ~finished
    # Write the whole block; entries past `take` land beyond the row's output and are either
    # overwritten next round or never read (out is sized max(max_new) + W for this).
    columns = rows.n_out[:, None] + offsets[None]                          # [B, W]
    out[rows.row_ids[:, None].expand(B, W), columns] = block
    newest = block.gather(1, accepted[:, None])[:, 0]                      # [B]
    before = block.gather(1, (accepted - 1).clamp(min=0)[:, None])[:, 0]
    before = torch.where(accepted > 0, before, rows.last)
    after = Rows(row_ids=rows.row_ids,
                 last=torch.where(continuing, newest, rows.last),
                 prev=torch.where(continuing, before, rows.prev),
                 n_out=rows.n_out + take,
                 max_new=rows.max_new,
                 active=continuing)
    # Rollback: keep everything committed except the newest token, for continuing rows only.
    new_lengths = lengths + torch.where(continuing, offered, 0)
    return after, new_lengths, take, finished, continuing
