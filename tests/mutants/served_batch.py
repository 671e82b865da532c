"""Served engines for the kit's "served_batch" family: fake servers that are correct for a
request answered alone and break only when requests are in flight together.

    Batching           the base: a correct server that schedules like a batching engine. Each
                       request waits until WINDOW seconds have passed with no new arrival (one
                       scheduler step that gathers a burst, however slowly a loaded machine
                       delivers it), takes the lowest free batch slot, and learns how many
                       requests are in flight with it (its batch). It answers as FakeServer.
    FlipsClosestCall   (a) greedy: inside a batch of two or more, the output's closest call (the
                       position with the smallest top-two logit gap) goes to the runner-up, as a
                       reduction whose order depends on the batch shape flips a close argmax
                       (here with an error large enough to flip it every time)
    SharedBatchState   (b) unseeded sampling: the requests in flight together copy one generator
                       state, drawn when the batch formed (one random state per batch step where
                       one per row was meant), so their draws use the same uniforms
    SlotSeeded         (c) seeded sampling: inside a batch a row's generator is seeded with
                       seed + its batch slot (per-slot generators keyed by the slot rather than
                       the request); alone a request has slot 0 and keeps its seed

Each mutant leaves the other kinds of request untouched, so exactly one batch check rejects it.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from properties import oracle
from tests.fakes.server import FakeServer


class Batching(FakeServer):
    """A correct fake that knows, for each request, its batch slot and batch size."""

    # Seconds without a new arrival that close a batch. A fixed wait from each request's own
    # arrival let a burst's requests miss each other on a loaded CI machine (the client's threads
    # started more than the wait apart), and a mutant that breaks only inside batches then passed.
    WINDOW = 0.05
    LONGEST = 2.0   # no request waits longer than this for a burst to end

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.flight_lock = threading.Lock()
        self.in_flight: set[int] = set()     # occupied batch slots
        self.batch_seed = 0                  # drawn as a batch forms (at an idle server)
        self.batch_sizes: list[int] = []     # every request's batch size, for the tests
        self.last_arrival = 0.0              # time.monotonic() of the newest request
        self.row = threading.local()         # this request's slot and batch size (one thread each)

    def complete(self, body: dict):
        with self.flight_lock:
            if not self.in_flight:
                self.batch_seed = self.shared_rng.getrandbits(63)
            slot = min(set(range(len(self.in_flight) + 1)) - self.in_flight)
            self.in_flight.add(slot)
            arrived = self.last_arrival = time.monotonic()
        try:
            while True:
                with self.flight_lock:
                    quiet_until = min(self.last_arrival + self.WINDOW, arrived + self.LONGEST)
                wait = quiet_until - time.monotonic()
                if wait <= 0:
                    break
                time.sleep(wait)
            with self.flight_lock:
                self.row.slot, self.row.batch = slot, len(self.in_flight)
                self.batch_sizes.append(self.row.batch)
            return super().complete(body)
        finally:
            with self.flight_lock:
                self.in_flight.discard(slot)

    @property
    def batched(self) -> bool:
        return getattr(self.row, "batch", 1) > 1


class FlipsClosestCall(Batching):
    """(a) Inside a batch, the greedy output's closest call flips to the runner-up."""

    def _generate(self, ids, max_tokens, temperature, top_k, top_p, stops, rng):
        out = super()._generate(ids, max_tokens, temperature, top_k, top_p, stops, rng)
        if temperature != 0 or not self.batched or not out:
            return out
        logits = oracle.served_logits(list(ids), out)
        top2 = logits.topk(2, dim=-1)
        gaps = (top2.values[:, 0] - top2.values[:, 1]).tolist()
        at = int(np.argmin(gaps))
        flipped = out[:at] + [int(top2.indices[at, 1])]
        if flipped[-1] in stops or len(flipped) == max_tokens:
            return flipped
        return flipped + super()._generate(list(ids) + flipped, max_tokens - len(flipped), 0.0,
                                           top_k, top_p, stops, rng)


class SharedBatchState(Batching):
    """(b) Unseeded requests in flight together draw from copies of one generator state."""

    def _rng(self, seed, i):
        if seed is None and self.batched:
            return np.random.default_rng([self.batch_seed, i])
        return super()._rng(seed, i)


class SlotSeeded(Batching):
    """(c) Inside a batch, a seeded request's generator is keyed by seed + its batch slot."""

    def _rng(self, seed, i):
        if seed is not None and self.batched:
            return np.random.default_rng([int(seed) + self.row.slot, i])
        return super()._rng(seed, i)


MUTANTS = {"greedy": FlipsClosestCall, "independence": SharedBatchState, "seed": SlotSeeded}
