"""Fine-tuning of a BERT export on downstream tasks, in plain PyTorch (``python -m finetune``).

Modules: __main__ (the command), config (``FinetuneConfig``: defaults < JSON < flags), data
(read, validate, encode, collate), qa (QA features: windows with a document stride), train
(optimizer, schedule, loop, ``run``), params (which parameters train, epoch by epoch, at
which learning rate), metrics (each task's scores), squad (QA answers from the windows'
logits, SQuAD 1.1/2.0 scores), embed (sentence embeddings for search from a fine-tuned
directory). It shares nothing with the DeepSpeed pretraining of trainer/ and needs torch
but not DeepSpeed.
"""

import importlib.util

if importlib.util.find_spec("torch") is None:  # the base install is the pipeline's only
    raise ModuleNotFoundError(
        "finetune/ needs torch, which the base install (the data pipeline's) leaves out: "
        "pip install 'bert-pipeline[train]' (in a clone: pip install -e '.[train]')",
        name="torch",
    )
