"""The paper's published numbers: Table 2 (newstest2014 BLEU, training cost) and Table 3 (variants).

Shared by evaluation (a Table 3 row's results.json carries its paper row), the Table 3 sweep
and the report that prints ours beside the paper's. Source: Vaswani et al. 2017, Tables 2
and 3 (shared/PAPER.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Paper Table 2 (newstest2014): tokenized BLEU and training cost in FLOPs.
PAPER_TABLE2 = {
    "base": {"de": 27.3, "fr": 38.1, "cost_de": 3.3e18, "cost_fr": 3.3e18},
    "big": {"de": 28.4, "fr": 41.8, "cost_de": 2.3e19, "cost_fr": 2.3e19},
}
TABLE2_TEST_SET = "newstest2014"
PAPER_TOKENS_PER_STEP = 25_000
"""Section 5.1: "approximately 25000 source tokens and 25000 target tokens" per batch."""


@dataclass(frozen=True)
class PaperRow:
    """One line of the paper's Table 3 (EN-DE newstest2013, no checkpoint averaging).

    ``ppl`` is per word-piece on the development set, ``bleu`` tokenized BLEU, ``params``
    in millions (None where the paper leaves the cell empty), ``steps`` training steps.
    """

    variant: str
    row: str
    change: str
    N: int
    d_model: int
    d_ff: int
    h: int
    d_k: int
    d_v: int
    P_drop: float
    eps_ls: float
    positions: str
    steps: int
    ppl: float
    bleu: float
    params: float | None

    def setting(self) -> dict[str, Any]:
        """(N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, positions) as a dict."""
        return {k: getattr(self, k) for k in SETTING_KEYS}


SETTING_KEYS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "positions")


def _row(variant: str, row: str, change: str, ppl: float, bleu: float, params: float | None,
         **changes: Any) -> PaperRow:
    base = {"N": 6, "d_model": 512, "d_ff": 2048, "h": 8, "d_k": 64, "d_v": 64,
            "P_drop": 0.1, "eps_ls": 0.1, "positions": "sinusoidal", "steps": 100_000}
    return PaperRow(variant, row, change, **{**base, **changes}, ppl=ppl, bleu=bleu, params=params)


PAPER_TABLE3: dict[str, PaperRow] = {r.variant: r for r in [
    _row("base", "base", "base model", 4.92, 25.8, 65),
    _row("A_h1", "A", "h=1, d_k=d_v=512", 5.29, 24.9, None, h=1, d_k=512, d_v=512),
    _row("A_h4", "A", "h=4, d_k=d_v=128", 5.00, 25.5, None, h=4, d_k=128, d_v=128),
    _row("A_h16", "A", "h=16, d_k=d_v=32", 4.91, 25.8, None, h=16, d_k=32, d_v=32),
    _row("A_h32", "A", "h=32, d_k=d_v=16", 5.01, 25.4, None, h=32, d_k=16, d_v=16),
    _row("B_dk16", "B", "d_k=16", 5.16, 25.1, 58, d_k=16),
    _row("B_dk32", "B", "d_k=32", 5.01, 25.4, 60, d_k=32),
    _row("C_N2", "C", "N=2", 6.11, 23.7, 36, N=2),
    _row("C_N4", "C", "N=4", 5.19, 25.3, 50, N=4),
    _row("C_N8", "C", "N=8", 4.88, 25.5, 80, N=8),
    _row("C_dmodel256", "C", "d_model=256, d_k=d_v=32", 5.75, 24.5, 28,
         d_model=256, d_k=32, d_v=32),
    _row("C_dmodel1024", "C", "d_model=1024, d_k=d_v=128", 4.66, 26.0, 168,
         d_model=1024, d_k=128, d_v=128),
    _row("C_dff1024", "C", "d_ff=1024", 5.12, 25.4, 53, d_ff=1024),
    _row("C_dff4096", "C", "d_ff=4096", 4.75, 26.2, 90, d_ff=4096),
    _row("D_drop0", "D", "P_drop=0.0", 5.77, 24.6, None, P_drop=0.0),
    _row("D_drop02", "D", "P_drop=0.2", 4.95, 25.5, None, P_drop=0.2),
    _row("D_ls0", "D", "eps_ls=0.0", 4.67, 25.3, None, eps_ls=0.0),
    _row("D_ls02", "D", "eps_ls=0.2", 5.47, 25.7, None, eps_ls=0.2),
    _row("E_learned", "E", "learned positional embedding", 4.92, 25.7, None, positions="learned"),
    _row("big", "big", "big model", 4.33, 26.4, 213, d_model=1024, d_ff=4096, h=16, P_drop=0.3,
         steps=300_000),
]}
"""The paper's Table 3 (shared/PAPER.md), keyed by the ``table3`` config name."""

DEV_SET = "newstest2013"
"""The paper's Table 3 test set: WMT14's development set (``data.valid_split``)."""
