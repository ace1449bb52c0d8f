"""DeepSpeed ZeRO pretraining of model/ BERT on pipeline/ shards (entry point: trainer/run.py).

Pretraining modules, in the order a run uses them: config (flags), dsconfig + dskeys (the
DeepSpeed JSON, its keys checked against DeepSpeed's), distributed (process group, RNG states),
ops (a line before DeepSpeed compiles an op), prepare (checks, model), shards + order + data
(the streamed batches), loop (training), metrics, evaluate, checkpoint, export (+ hf_tokenizer:
the shards' tokenizer files in the export); fillmask is a demo on an export.
"""
