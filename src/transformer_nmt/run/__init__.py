"""The run folder (``runs/<name>/``) and what in it more than one command reads or writes.

* :mod:`.lock`: the lock every writing command holds on the folder it writes into;
* :mod:`.model_file`: which model file a command decodes with (averaged, latest, or named);
* :mod:`.summary`: ``train_summary.json``, its one writer and its one reader;
* :mod:`.results`: ``results.json``, how an evaluation is merged into it and how it is read.

Below ``decode`` and above ``checkpoint`` in the import order; imports nothing here, so
``nmt-table`` reads results without loading torch.
"""
