"""Data: download, clean, shared BPE, binarize, and length-bucketed token batches.

* :mod:`.corpora`: WMT14 (datasets hub), Multi30k (URL or local mirror), custom files;
  :mod:`.hub`: opening the hub's stream, network faults told from data faults, progress;
* :mod:`.clean`: the training-pair filters, and the text steps ``data.lowercase`` /
  ``data.pretokenize`` (:mod:`.moses`: the Moses scripts, also used by the BLEU forms);
  :mod:`.bpe`: the shared SentencePiece model
  (special ids live here only); :mod:`.binarize`: token ids on disk;
* :mod:`.batching`: the length-bucketed sampler under a ``max_tokens`` budget;
* :mod:`.prepare`: every stage in order (nmt-prepare).
"""
