"""Evaluation: BLEU (sacreBLEU and the paper's tokenized form), test sets, the paper's tables.

* :mod:`.bleu`: sacreBLEU, chrF and the paper's BLEU, each labelled with its signature;
* :mod:`.evaluate`: decode the test sets of a run and write ``results.json``;
* :mod:`.paper`: the paper's published Table 2 and Table 3;
* :mod:`.table3`: Table 3 rows applied to an experiment, and their evaluation;
* :mod:`.report`: Table 2 and Table 3, ours beside the paper's (nmt-table).
"""
