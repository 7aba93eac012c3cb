"""The paper's Table 3 (section 6.2): its rows, applied to any base experiment, and their evaluation.

A row is a config of the ``table3`` group (``configs/table3/<variant>.yaml``,
:class:`transformer_nmt.config.Table3Config`): multipliers of the experiment's own values
(``scale``) and absolute values (``fixed``). :func:`apply_row` turns it into model and
trainer settings, so the same row file gives the paper's values on ``wmt14_en_de_base``
(tested against :data:`PAPER_TABLE3`) and the same relative change on the CPU proxy
(``experiment=table3_proxy``, the ``tiny`` model). The scaling rule:

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformer_nmt.errors import UserError

if TYPE_CHECKING:
    from transformer_nmt.config import Config, ModelConfig

log = logging.getLogger(__name__)

SCALABLE = ("heads", "d_k", "layers", "d_model", "d_ff", "max_steps")
"""Keys of ``table3.scale``."""
SETTABLE = ("heads", "dropout", "label_smoothing", "positions")
"""Keys of ``table3.fixed``."""


class Table3Error(UserError):
    """A row that cannot be applied to the experiment (names the row, key and values)."""


def _whole(row: str, key: str, base: Any, factor: float) -> int:
    value = float(base) * float(factor)
    if round(value) < 1 or abs(value - round(value)) > 1e-3 * max(1.0, abs(value)):
        raise Table3Error(
            f"table3={row}: {key} {base} x {factor:g} = {value:g} is not a positive whole number; "
            f"this row does not scale to the experiment's {key}={base}")
    return round(value)


def apply_row(cfg: Config) -> Config:
    """Write the row ``cfg.table3`` into ``cfg.model`` / ``cfg.trainer`` (in place) and return cfg.

    A config without a row (``table3.variant`` None), or one whose row was applied already
    (the entry points apply it in ``cli.typed_config``), is returned unchanged. Multipliers act on
    the composed experiment's values; ``d_k`` scales the effective size (d_model / heads when
    unset), and a row that changes heads or d_model leaves d_k / d_v to follow d_model / heads
    unless the experiment set them.

    Raises:
        Table3Error: an unknown key, or a product that is not a positive whole number (names
            the row, the key and the values).
    """
    t = cfg.table3
    if not t.variant or getattr(t, "_applied", False):  # never scale twice
        return cfg
    row = str(t.variant)
    scale, values = dict(t.scale or {}), dict(t.fixed or {})
    for key in scale:
        if key not in SCALABLE:
            raise Table3Error(f"table3={row}: table3.scale.{key} is not one of {list(SCALABLE)}")
    for key in values:
        if key not in SETTABLE:
            raise Table3Error(f"table3={row}: table3.fixed.{key} is not one of {list(SETTABLE)}")
    m, tr = cfg.model, cfg.trainer
    d_k_base = m.d_k or m.d_model // m.heads
    if "layers" in scale:
        m.encoder_layers = _whole(row, "encoder_layers", m.encoder_layers, scale["layers"])
        m.decoder_layers = _whole(row, "decoder_layers", m.decoder_layers, scale["layers"])
    for key in ("heads", "d_model", "d_ff"):
        if key in scale:
            setattr(m, key, _whole(row, key, getattr(m, key), scale[key]))
    if "d_k" in scale:
        m.d_k = _whole(row, "d_k", d_k_base, scale["d_k"])
    if "max_steps" in scale and t.scale_steps and tr.max_steps is not None:
        tr.max_steps = _whole(row, "max_steps", tr.max_steps, scale["max_steps"])
    for key, value in values.items():
        if key == "label_smoothing":
            tr.label_smoothing = float(value)
        elif key == "dropout":
            m.dropout = float(value)
        elif key == "positions":
            from transformer_nmt.config import Positions

            m.positions = Positions(value)
        else:
            setattr(m, key, int(value))
    object.__setattr__(t, "_applied", True)
    return cfg


def setting(model_cfg: ModelConfig | dict[str, Any],
            label_smoothing: float | None) -> dict[str, Any] | None:
    """A model's (N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, positions) as in Table 3.

    Args:
        model_cfg: a model config, or its plain dict (results.json).
        label_smoothing: the run's epsilon_ls.

    Returns:
        The setting, or None when the encoder and decoder depths differ.
    """
    get = model_cfg.get if isinstance(model_cfg, dict) else lambda k, d=None: getattr(model_cfg, k, d)
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
    from transformer_nmt.checkpoint import checkpoint_dir, latest_checkpoint

    latest = latest_checkpoint(cfg.run_dir)
    if latest is None:
        raise FileNotFoundError(
            f"table3={cfg.table3.variant}: no checkpoint_<step>.pt in {checkpoint_dir(cfg.run_dir)} "
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
    from transformer_nmt.data.bpe import file_digest
    from transformer_nmt.evaluate.results import ResultsError, read_results

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


def evaluate_row(cfg: Config) -> dict[str, Any] | None:
    """Evaluate a trained row (:func:`evaluation_config`); None when results.json is current."""
    from transformer_nmt.evaluate.evaluate import evaluate

    if results_are_current(cfg):
        log.info("table3=%s: %s/results.json is current; not evaluated again",
                 cfg.table3.variant, cfg.run_dir)
        return None
    return evaluate(evaluation_config(cfg))
