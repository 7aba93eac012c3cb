"""Interoperability: our checkpoints to other toolkits' formats, and back.

Pipeline position: train -> average -> **export** (nmt-export), and a Marian-architecture
transformers folder -> **import** (nmt-import) -> translate / evaluate / fine-tune.
One module per format and direction:

* :mod:`.common`: what every format shares (errors, special pieces, model card, the
  export folder written atomically, the peers imported lazily);
* :mod:`.marian`: the state-dict mapping ours <-> Hugging Face ``MarianMTModel``
  (channel permutation of the sinusoidal positions, fused projections);
* :mod:`.hf`: export to a Hugging Face folder (weights, config, tokenizer, model card);
* :mod:`.marian_import`: import of a Marian-architecture folder into our checkpoint;
* :mod:`.ctranslate2`: export to CTranslate2 through its ``TransformerSpec`` and the
  ``decode.engine=ctranslate2`` decoding engine.

The peers (``transformers``, ``ctranslate2``, ``safetensors``) are the optional ``export``
extra (``pip install -e ".[export]"``) and are imported lazily.
"""
