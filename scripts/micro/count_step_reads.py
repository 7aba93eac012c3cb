"""Host reads of the training loop, counted on the CPU: how many per optimizer step, and where
each falls relative to the model forwards (a read that waits for step k's figures before step
k+1's forward is queued leaves a GPU idle while the host prepares step k+1).

Trains the tiny model for ``--steps`` steps of ``--update-freq`` micro-batches on a Multi30k
slice (prepared under ``--work`` from the mirror in ``NMT_MULTI30K_MIRROR``), with nothing
saved, validated or logged in between (the final validation and summary are left out), and
records the order of: each step's
``forward_backward``, each model forward inside it, and every Python read of a tensor's values
(``item``, ``tolist``, ``bool``, ``float``, ``int``, ``index``, ``cpu``, ``numpy``: each a
host-device synchronisation on a GPU).

Example::

    NMT_MULTI30K_MIRROR=... PYTHONPATH=src .venv/bin/python scripts/micro/count_step_reads.py \\
        --work /tmp/reads

Prints one JSON object: the reads of each step (between its ``forward_backward`` and the
next one's) and, for the n-th read, the last step whose forwards were issued before it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy")


def overrides(work: Path, steps: int, update_freq: int) -> list[str]:
    """A tiny model on a 400-pair Multi30k slice with a 200-piece vocabulary."""
    return ["experiment=multi30k_en_de", "model=tiny", "model.encoder_layers=1",
            "model.decoder_layers=1", "model.d_model=32", "model.d_ff=64", "model.heads=2",
            "data.max_train_pairs=400", "data.vocab_size=200", f"data.root={work / 'data'}",
            f"run_dir={work / 'run'}", f"trainer.max_steps={steps}",
            f"trainer.update_freq={update_freq}", "trainer.max_tokens=512",
            "trainer.log_every_steps=1000", "trainer.validate_every_steps=null",
            "trainer.save_every_steps=null", "trainer.save_every_minutes=null",
            "trainer.num_workers=0", "trainer.compile=false"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, help="folder for the data slice and the run")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--update-freq", type=int, default=2)
    args = p.parse_args()
    import shutil

    import transformer_nmt.train.loop as loop
    from transformer_nmt.config import compose
    from transformer_nmt.data.prepare import prepare
    from transformer_nmt.model.transformer import Transformer

    work = Path(args.work).resolve()
    cfg = compose(overrides(work, args.steps, args.update_freq))
    if not (work / "data").is_dir():
        prepare(cfg)
    shutil.rmtree(work / "run", ignore_errors=True)

    events: list[tuple[str, object]] = []
    state = {"step": 0, "in_fb": False, "done": False}

    def counting(original, name):
        def wrapper(tensor, *a, **kw):
            if state["step"] and not state["done"]:
                events.append(("read", name))
            return original(tensor, *a, **kw)
        return wrapper

    for name in READS:
        setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name), name))
    real_fb, real_forward = loop.forward_backward, Transformer.forward

    def fb(*a, **kw):
        state["step"] += 1
        events.append(("fb", state["step"]))
        state["in_fb"] = True
        try:
            return real_fb(*a, **kw)
        finally:
            state["in_fb"] = False

    def forward(model, *a, **kw):
        if state["in_fb"]:
            events.append(("forward", state["step"]))
        return real_forward(model, *a, **kw)

    def ends_the_steps(original):
        def wrapper(*a, **kw):  # the final validation and checkpoint: not a step's reads
            state["done"] = True
            return original(*a, **kw)
        return wrapper

    loop.forward_backward = fb
    Transformer.forward = forward
    loop.run_validation = ends_the_steps(loop.run_validation)
    loop.write_summary = ends_the_steps(loop.write_summary)
    summary = loop.train(cfg)

    per_step = [0] * args.steps
    after_forwards_of: list[int] = []
    step = forwarded = 0
    for kind, value in events:
        if kind == "fb":
            step = int(value)
        elif kind == "forward":
            forwarded = int(value)
        elif kind == "read":
            per_step[step - 1] += 1
            after_forwards_of.append(forwarded)
    print(json.dumps({
        "steps": summary["steps"], "update_freq": args.update_freq,
        "host_reads_per_step": per_step,
        "nth_read_after_forwards_of_step": after_forwards_of,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
    }, indent=1))


if __name__ == "__main__":
    main()
