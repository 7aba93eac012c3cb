"""The model: the Transformer of sections 3.1-3.5, its decoder cache, and its FLOPs.

* :mod:`.transformer`: encoder, decoder, attention, positions, embeddings;
* :mod:`.cache`: the decoder's key/value cache for incremental decoding (one-copy reorder);
* :mod:`.flops`: training and decoding FLOPs per token (MFU, the paper's cost column).
"""
