"""Training: one explicit loop for every world size (section 5).

* :mod:`.loop`: the loop (top to bottom), signals, stop checkpoint;
* :mod:`.setup`: model, optimizer, schedule, data and DDP built from the config;
* :mod:`.data`: the binarized corpus and the length-bucketed sampler of a run;
* :mod:`.step`: one optimizer step (micro-batches, loss normalisation, clipping);
* :mod:`.state`: the loop's counters; :mod:`.resume`: save and resume a run exactly;
* :mod:`.loss`: label-smoothed cross entropy; :mod:`.optim`: Adam and the warm-up schedule;
* :mod:`.validation`: perplexity and BLEU on the development set;
* :mod:`.metrics`: metrics.jsonl, TensorBoard, the log line; :mod:`.summary`: train_summary.json;
* :mod:`.distributed`: process groups, all-reduce helpers; :mod:`.dryrun`: a few real steps;
* :mod:`.startup_signals`: stop signals recorded from the first moment of ``nmt-train``.
"""
