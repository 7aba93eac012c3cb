"""DataLoader workers persist across epochs (forked once, not again every epoch), and each
epoch still follows the sampler's ``set_epoch`` as without workers."""

from __future__ import annotations

import numpy as np

from transformer_nmt.data.batching import LengthBucketSampler, ParallelDataset
from transformer_nmt.data.loader import build_dataloader


class _Tokens:
    """In-memory token ids: ``.sizes``, ``len``, ``[i]`` (as binarize.TokenDataset)."""

    def __init__(self, seqs):
        self.seqs = [np.asarray(s, dtype=np.int64) for s in seqs]
        self.sizes = np.array([len(s) for s in self.seqs], dtype=np.int64)

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return self.seqs[i]


def random_corpus(n: int, seed: int) -> ParallelDataset:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 20, (2, n))
    return ParallelDataset(_Tokens([rng.integers(4, 100, k) for k in sizes[0]]),
                           _Tokens([rng.integers(4, 100, k) for k in sizes[1]]))


def _epochs(loader, sampler, epochs):
    out = []
    for epoch in epochs:
        sampler.set_epoch(epoch)
        it = iter(loader)
        out.append([b.ids.tolist() for b in it])
        pids = sorted(w.pid for w in getattr(it, "_workers", []))
        out.append(pids)
    return out


def test_workers_persist_and_epochs_follow_the_sampler():
    ds = random_corpus(200, seed=4)
    plain_sampler = LengthBucketSampler(ds.src_sizes, ds.tgt_sizes, 64, seed=3)
    sampler = LengthBucketSampler(ds.src_sizes, ds.tgt_sizes, 64, seed=3)
    loader = build_dataloader(ds, sampler, num_workers=1)
    assert loader.persistent_workers
    plain = _epochs(build_dataloader(ds, plain_sampler), plain_sampler, [0, 1, 2])
    workers = _epochs(loader, sampler, [0, 1, 2])
    assert workers[0::2] == plain[0::2]  # the same batches, epoch by epoch
    assert workers[0] != workers[2]  # set_epoch reshuffled
    assert workers[1] == workers[3] == workers[5] and len(workers[1]) == 1  # one worker, kept
    assert not build_dataloader(ds, sampler, num_workers=0).persistent_workers
