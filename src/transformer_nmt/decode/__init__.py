"""Decoding: beam search and greedy search over the decoder cache; text in, text out.

* :mod:`.beam_search`: batched beam search (section 6.1: beam 4, length penalty alpha)
  and greedy search;
* :mod:`.translate`: tokenize, batch by length, decode, detokenize, order kept (nmt-translate).
"""
