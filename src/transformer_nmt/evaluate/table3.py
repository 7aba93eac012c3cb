"""The paper's Table 3 (section 6.2): its rows, applied to any base experiment, and their
evaluation.

A row is a config of the ``table3`` group (``configs/table3/<variant>.yaml``,
:class:`transformer_nmt.config.Table3Config`): multipliers of the experiment's own values
(``scale``) and absolute values (``fixed``). :func:`transformer_nmt.config.apply_row` turns it
into model and trainer settings, so the same row file gives the paper's values on
``wmt14_en_de_base`` (tested against :data:`PAPER_TABLE3`) and the same relative change on the CPU
proxy (``experiment=table3_proxy``, the ``tiny`` model). The scaling rule:

* A: ``h`` x 1/2, x 2, x 4 with d_k = d_v = d_model / h; the single-head row sets h = 1;
* B: d_k x 1/4, x 1/2 of d_model / h, d_v unchanged;
* C: N (encoder and decoder) x 1/3, x 2/3, x 4/3; d_model x 1/2, x 2 (h unchanged, so
  d_k = d_v follow); d_ff x 1/2, x 2;
* D: P_drop 0.0 / 0.2 and epsilon_ls 0.0 / 0.2 as absolute values; E: learned positions;
* big: d_model, d_ff and h x 2, P_drop 0.3, steps x 3 (unless ``table3.scale_steps=false``).

The paper evaluated Table 3 on newstest2013 (WMT14's development set) with beam search and
no checkpoint averaging; :func:`evaluation_config` does the same with ``data.valid_split``
and the run's last checkpoint, and :func:`evaluate_row` skips a row whose results.json
already belongs to that checkpoint (a sweep can be finished over several sittings).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_nmt.config.schema import field_value
from transformer_nmt.fileio import file_digest
from transformer_nmt.run.results import ResultsError, read_results

if TYPE_CHECKING:
    from transformer_nmt.config import Config, ModelConfig
    from transformer_nmt.decode.translate import EngineFactory

log = logging.getLogger(__name__)


def setting(model_cfg: ModelConfig | dict[str, Any],
            label_smoothing: float | None) -> dict[str, Any] | None:
    """A model's (N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, positions) as in Table 3.

    Args:
        model_cfg: a model config, or its plain dict (results.json).
        label_smoothing: the run's epsilon_ls.

    Returns:
        The setting, or None when the encoder and decoder depths differ.
    """
    def get(key: str, default: Any = None) -> Any:
        return field_value(model_cfg, key, default)

    if get("encoder_layers") != get("decoder_layers"):
        return None
    heads, d_model = get("heads"), get("d_model")
    return {
        "N": get("encoder_layers"), "d_model": d_model, "d_ff": get("d_ff"), "h": heads,
        "d_k": get("d_k") or d_model // heads, "d_v": get("d_v") or d_model // heads,
        "P_drop": float(get("dropout", 0.1)), "eps_ls": float(label_smoothing or 0.0),
        "positions": str(get("positions", "sinusoidal")),
    }


def evaluation_config(cfg: Config) -> Config:
    """A copy of ``cfg`` that evaluates the row the paper's way: the development set
    (``data.valid_split``) as the only test set, and the run's last checkpoint (no averaging).

    Raises:
        FileNotFoundError: the run has no checkpoint yet (names the folder).
    """
    # late: the checkpoint package loads torch, which nmt-table (through setting) never needs
    from transformer_nmt.checkpoint import checkpoint_dir, latest_checkpoint

    latest = latest_checkpoint(cfg.run_dir)
    if latest is None:
        raise FileNotFoundError(
            f"table3={cfg.table3.variant}: no checkpoint_<step>.pt in "
            f"{checkpoint_dir(cfg.run_dir)} "
            "(train the row first)")
    out = copy.deepcopy(cfg)
    out.data.test_splits = [out.data.valid_split]
    out.decode.checkpoint = str(latest)
    return out


def results_are_current(cfg: Config) -> bool:
    """True when ``<run_dir>/results.json`` was written from the row's last checkpoint with
    the same decoding settings and test sets as :func:`evaluation_config` gives now.

    The checkpoint is compared by content (``checkpoint_sha256``), not by its path: a row
    retrained (on another corpus, after its checkpoints were deleted) writes a checkpoint of
    the same name. A results.json without the digest is not current."""
    path = Path(cfg.run_dir) / "results.json"
    if not path.is_file():
        return False
    try:
        results = read_results(path)
    except ResultsError:
        return False
    old = results.raw
    ev = evaluation_config(cfg)
    if old.get("checkpoint_sha256") != file_digest(ev.decode.checkpoint):
        return False
    decode = dataclasses.asdict(ev.decode)
    same_decode = all(old.get("decode", {}).get(k) == v for k, v in decode.items()
                      if k in old.get("decode", {}))
    return (old.get("checkpoint") == str(ev.decode.checkpoint) and same_decode
            and all(split in results.test_sets for split in ev.data.test_splits))


def evaluate_row(cfg: Config, engine: EngineFactory | None = None) -> dict[str, Any] | None:
    """Evaluate a trained row (:func:`evaluation_config`; ``engine`` as for
    :func:`transformer_nmt.evaluate.evaluate.evaluate`); None when results.json is current."""
    # late: evaluation loads torch, which nmt-table (through setting) never needs
    from transformer_nmt.evaluate.evaluate import evaluate

    if results_are_current(cfg):
        log.info("table3=%s: %s/results.json is current; not evaluated again",
                 cfg.table3.variant, cfg.run_dir)
        return None
    return evaluate(evaluation_config(cfg), engine=engine)


def evaluate_after_training(cfg: Config, summary: dict[str, Any] | None = None,
                            engine: EngineFactory | None = None) -> dict[str, Any] | None:
    """``nmt-train``'s last act for a Table 3 row (``table3.variant`` set, ``table3.evaluate``
    true): rank 0 evaluates it (:func:`evaluate_row`; a row whose training stopped before its
    step target is evaluated too, and its results.json says so: ``stopped_short``). None on
    other ranks, without a row, when its results.json is current, or when a stop signal
    ended the training (``summary``) before the row had any checkpoint."""
    if not (cfg.table3.variant and cfg.table3.evaluate and int(os.environ.get("RANK", "0")) == 0):
        return None
    # late: the checkpoint package and the runtime load torch, which nmt-table never needs
    from transformer_nmt.checkpoint import latest_checkpoint
    from transformer_nmt.runtime import retain_freed_memory

    stopped_by = str((summary or {}).get("stopped_by") or "")
    if stopped_by.startswith("signal") and latest_checkpoint(cfg.run_dir) is None:
        log.info("table3=%s: %s before the row's first checkpoint; not evaluated",
                 cfg.table3.variant, stopped_by)
        return None
    retain_freed_memory()  # beam search allocates large tensors at every step
    return evaluate_row(cfg, engine)
