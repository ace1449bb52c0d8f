"""DeepSpeed ZeRO pretraining of model/ BERT on pipeline/ shards (entry point: trainer/run.py).

Modules, in the order a run uses them:

- run: the command, ``main(argv) -> int``; config: its flags and JSON (``TrainConfig``);
- signals: Ctrl-C / SIGTERM finish the step, save and print the resume command;
  failure: any rank's failure ends every rank, with one line;
- distributed: the process group and RNG states;
- loop: the run itself (``Trainer``), which uses, in order:
  - prepare: paths, shards, the model config against the manifest, the model;
  - dsconfig + dskeys: the DeepSpeed JSON, its batch sizes and its keys checked against
    DeepSpeed's; schedule: the time budget (``--max-minutes``) as a learning-rate schedule;
  - distillation: the frozen teacher of ``--teacher``;
  - ops: a line before DeepSpeed compiles an op;
  - checkpoint: save and resume; universal: resume on another number of ranks;
  - shards + order + data: the streamed batches (random access, the seeded order, padding
    and dynamic masks);
  - metrics: what is logged (loss, accuracies, tokens/s, MFU); evaluate: held-out loss;
- export: a checkpoint to a Hugging Face directory (+ hf_tokenizer: the shards' tokenizer
  files in it); fillmask: a demo on an export (``python -m trainer.fillmask``).

What a run wrote is read back by report/ (plots, the summary), which needs neither torch
nor DeepSpeed.
"""

import importlib.util

# The base install is the data pipeline's only (what Beam workers install); say what to add.
_missing = [name for name in ("torch", "deepspeed") if importlib.util.find_spec(name) is None]
if _missing:
    raise ModuleNotFoundError(
        f"trainer/ needs {' and '.join(_missing)}, which the base install (the data "
        "pipeline's) leaves out: pip install 'bert-pipeline[train]' "
        "(in a clone: pip install -e '.[train]')",
        name=_missing[0],
    )
