"""``python -m pipeline export --to mds``'s steps: one shard -> one MDS directory, and the
dataset's index.json over them all (pipeline/shards/mds_format.py says what the files hold).

Part of pipeline/beam/export.py's job: each shard is written by one worker, as streaming's
``MDSWriter`` writes it (mds_format.write_mds), into a local temporary directory, then each
file is copied atomically (in chunks: memory holds one MDS shard file at most) to
``OUTPUT/shard-NNNNN-of-MMMMM/`` (local or object storage), the directory's index.json last.
After every shard, the driver's last step writes ``OUTPUT/index.json``, the directories'
indexes merged as streaming's ``merge_index`` merges them, then the export's manifest.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator

import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from pipeline.beam.shard_steps import write_atomic
from pipeline.shards import mds_format
from pipeline.shards.shard_writer import encode_manifest


def write_directory(table: pa.Table, directory: str, source: str, plan) -> list[dict]:
    """One shard as the MDS directory ``directory`` (each file atomically, its index.json
    last); returns the files' entries, the index's with the directory's ``index`` (for the
    dataset's index.json) and every file's ``rows`` (samples; 0 for the index).

    Args:
        plan: the export's ExportPlan (its config's output and token column).

    Raises:
        ImportError: mosaicml-streaming is missing (names the extra).
    """
    output = FileSystems.join(plan.config.output, directory)
    if not FileSystems.exists(output):
        FileSystems.mkdirs(output)
    entries = []
    with tempfile.TemporaryDirectory(prefix="bert-mds-") as tmp:
        local = os.path.join(tmp, directory)
        names = mds_format.write_mds(table, local, plan.config.mds_token_column or "input_ids")
        with open(os.path.join(local, mds_format.INDEX_NAME), "rb") as f:
            index = json.load(f)
        samples = {shard["raw_data"]["basename"]: shard["samples"] for shard in index["shards"]}
        for name in names:  # index.json last
            path = os.path.join(local, name)
            size, sha256 = write_atomic(FileSystems.join(output, name), _chunks(path))
            entries.append(
                {
                    "name": f"{directory}/{name}",
                    "rows": samples.get(name, 0),
                    "bytes": size,
                    "sha256": sha256,
                    "source": source,
                }
            )
    entries[-1]["index"] = index  # the manifest drops it, once merged into index.json
    return entries


def _chunks(path: str, size: int = 8 << 20) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk


def write_index(files: list[dict], output: str) -> dict:
    """Write ``OUTPUT/index.json`` over the directories of ``files`` (write_directory's
    entries, whose ``index`` it takes out); returns its entry."""
    indexes = sorted((f["name"].split("/")[0], f.pop("index")) for f in files if "index" in f)
    data = encode_manifest(mds_format.merged_index(indexes))
    size, sha256 = write_atomic(FileSystems.join(output, mds_format.INDEX_NAME), data)
    return {"name": mds_format.INDEX_NAME, "rows": 0, "bytes": size, "sha256": sha256}
