"""DeepSpeed ZeRO pretraining of model/ BERT on pipeline/ shards (entry point: trainer/run.py).

Pretraining modules, in the order a run uses them: config (flags), dsconfig + dskeys (the
DeepSpeed JSON, its keys checked against DeepSpeed's), distributed (process group, RNG states),
ops (a line before DeepSpeed compiles an op), prepare (checks, model), shards + order + data
(the streamed batches), loop (training), metrics, evaluate, checkpoint, export (+ hf_tokenizer:
the shards' tokenizer files in the export); fillmask is a demo on an export.
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
