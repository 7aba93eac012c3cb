"""Figures for reports, one module per kind, each written atomically (matplotlib, Agg).

* :mod:`.curves`: training curves from metrics.jsonl;
* :mod:`.checkpoint_bleu`: BLEU of every kept checkpoint and the average (section 6.1);
* :mod:`.attention`: attention maps (the paper's Figs. 3-5);
* :mod:`.table3`: Table 3 differences, ours beside the paper's;
* :mod:`.make`: what nmt-plot draws for a run; :mod:`.common`: saving and closing figures.
"""
