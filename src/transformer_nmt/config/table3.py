"""A row of the paper's Table 3 (``table3=<row>``) applied to the experiment's config.

The row (:class:`transformer_nmt.config.Table3Config`) holds multipliers of the experiment's
own values (``scale``) and absolute values (``fixed``); :func:`apply_row` writes the row's
model and trainer values into the config, so one row file gives the paper's values on
``wmt14_en_de_base`` and the same relative change on the CPU proxy. The scaling rule is
described in :mod:`transformer_nmt.evaluate.table3`, which trains and evaluates the rows.
"""

from __future__ import annotations

from typing import Any

from transformer_nmt.choices import Positions
from transformer_nmt.config.schema import Config
from transformer_nmt.errors import Table3Error

SCALABLE = ("heads", "d_k", "layers", "d_model", "d_ff", "max_steps")
"""Keys of ``table3.scale``."""
SETTABLE = ("heads", "dropout", "label_smoothing", "positions")
"""Keys of ``table3.fixed``."""


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
    (:func:`transformer_nmt.config.typed_config` applies it), is returned unchanged.
    Multipliers act on the composed experiment's values; ``d_k`` scales the effective size
    (d_model / heads when unset), and a row that changes heads or d_model leaves d_k / d_v to
    follow d_model / heads unless the experiment set them.

    Raises:
        Table3Error: an unknown key, or a product that is not a positive whole number (names
            the row, the key and the values).
    """
    t = cfg.table3
    if not t.variant or getattr(t, "_applied", False):  # never scale twice
        return cfg
    row = t.variant
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
            m.positions = Positions(value)
        else:
            setattr(m, key, int(value))
    object.__setattr__(t, "_applied", True)
    return cfg
