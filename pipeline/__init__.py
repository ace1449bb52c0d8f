"""Raw text to BERT pretraining shards, with Apache Beam. Four layers, each importing only
the ones above it in this list (tests/test_layout.py checks it):

- ``pipeline.shards``: the shard contract (FORMAT.md): ``shard_format`` (names, schema,
  manifest, the reader a trainer imports), ``shard_writer``, ``validate`` (every file and
  row against the contract), ``export_formats`` (NVIDIA HDF5, Google TFRecord). No Beam.
- ``pipeline.core``: the algorithms, pure functions: ``text`` (BERT's basic tokenization,
  sentences), ``sources`` (txt/jsonl/parquet documents), ``wordpiece`` (the learner),
  ``vocab``, ``nsp`` (Google's pairs), ``masking`` (80/10/10), ``rng`` (seeds), ``rows``.
  No Beam.
- ``pipeline.beam``: the jobs: ``build`` (the build's graph) with its steps
  (``document_steps``, ``instance_steps``, ``shard_steps``) and options (``config``),
  ``export``, ``runner`` (options, runner and log of a job), ``sizing`` (the local
  runner's memory check, Dask's partitions), ``dask_compat``.
- ``pipeline.cli``: the commands: ``main`` (``python -m pipeline build|stats|inspect|
  validate|export``), ``inspect_cli``, ``stats``, ``corpus`` (``python -m pipeline corpus``,
  with ``package_docs``: the installed packages' documentation).

Beside them, the command-line plumbing every command of the project uses (trainer/ and
finetune/ too): ``options`` (typed options, flags, did-you-mean) and ``console``.
"""
