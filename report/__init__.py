"""What a run wrote, read back without the training stack: no torch, no DeepSpeed.

- summary: paths, throughput, held-out accuracies beside their baselines, the quickstart's
  stage times against its deadline (``python -m report.summary RUN_DIR``);
- stages: a quickstart's stage times (``RUN_DIR/stages.jsonl``, scripts/stage.sh), for the
  summary;
- plot: PNGs of a ``metrics.jsonl`` (``python -m report.plot RUN_DIR``; the trainer also
  draws them at the end of a run).

The base install (``pip install -e .``) plus matplotlib runs both, so a laptop can read a
cluster run's output. ``report`` imports the pipeline's command-line plumbing and shard
contract only; trainer/ may import it, never the other way (tests/test_layout.py).
"""
