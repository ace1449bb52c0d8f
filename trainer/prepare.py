"""Everything checked and built before the first step: paths, data, model config, model.

All checks run before DeepSpeed builds the engine, so a bad invocation fails in seconds
with a message naming the file or field: a missing data directory or ds-config, shards
whose vocabulary (size or [PAD] id) differs from the model's, rows longer than the
model's positions, a corrupt shard (with ``--skip-corrupt``: skipped and counted), a
``--resume`` checkpoint of another model size.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path

import torch

from model import PRESETS, BertConfig, BertForPreTraining, load_hf
from pipeline.core.rng import derive_seed
from pipeline.shards import shard_format

from .config import TrainConfig, resolve_unpad
from .dsconfig import BatchSizes, precision
from .shards import ShardSet

logger = logging.getLogger(__name__)
# Model fields a resumed run may change: they change no weight's shape or meaning.
RESUMABLE_CHANGES = ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range")


def check_paths(config: TrainConfig) -> TrainConfig:
    """Fail early on local paths that do not exist.

    Returns ``config``, with a ``--data`` / ``--eval-data`` that names a shard directory's
    ``manifest.json`` replaced by that directory (logged).

    Raises:
        FileNotFoundError: naming the flag and the path.
    """
    config = dataclasses.replace(
        config,
        data=_shard_directory(config.data, "--data"),
        eval_data=_shard_directory(config.eval_data, "--eval-data"),
    )
    for flag, path in (("--data", config.data), ("--eval-data", config.eval_data)):
        if path is None or shard_format.is_remote(path):
            continue
        if not Path(path).is_dir():
            raise FileNotFoundError(f"{flag} {path}: no such directory")
        if not Path(path, shard_format.MANIFEST_NAME).is_file():
            raise FileNotFoundError(
                f"{flag} {path} has no {shard_format.MANIFEST_NAME}: not a shard directory, "
                "or the pipeline run did not finish (the manifest is written last)"
            )
    if config.init_from_hf is not None and not Path(config.init_from_hf).is_dir():
        raise FileNotFoundError(f"--init-from-hf {config.init_from_hf}: no such directory")
    return config


def _shard_directory(path: str | None, flag: str) -> str | None:
    """``shards/manifest.json`` -> ``shards`` (the flags take the directory); else ``path``."""
    if path is None or path.rstrip("/").rsplit("/", 1)[-1] != shard_format.MANIFEST_NAME:
        return path
    if shard_format.is_remote(path):
        directory = path.rstrip("/").rsplit("/", 1)[0]
    elif Path(path).is_file():
        directory = str(Path(path).parent)
    else:
        return path
    logger.info("%s %s is a manifest: reading its shard directory %s", flag, path, directory)
    return directory


def open_shards(path: str, config: TrainConfig, *, flag: str) -> ShardSet:
    """Read the manifest and run the start-up check of every shard.

    Raises:
        ShardFormatError: a bad manifest or shard (names the file).
    """
    shards = ShardSet(path)
    skipped = shards.check(verify=config.verify_shards, skip_corrupt=config.skip_corrupt)
    # Not verified by default: a sha256 of every shard reads the whole dataset on every rank
    # at start-up (docs/training.md, "Data"); sizes and row counts are
    # checked always, and a bad id met mid-run is a data error naming the row.
    checked = "sha256 verified" if config.verify_shards else "sha256 not checked: --verify-shards"
    logger.info(
        "%s %s: %d shards, %d rows (sizes and row counts checked, %s)%s",
        flag,
        path,
        len(shards.names),
        shards.num_rows,
        checked,
        f", skipped {len(skipped)} corrupt: {skipped}" if skipped else "",
    )
    return shards


def model_config(config: TrainConfig, manifest: dict) -> BertConfig:
    """The model's config from --model / --init-from-hf, checked against the shards.

    A preset takes its vocab_size and pad_token_id from the manifest (a preset names an
    architecture, not a vocabulary); a config.json or HF directory is used as it is.
    ``--dropout`` then sets both dropout probabilities.

    Raises:
        ValueError: unknown preset, bad config.json, vocabulary mismatch (naming both
            values), or rows longer than max_position_embeddings.
    """
    vocab = manifest["vocab"]
    if config.init_from_hf is not None:
        cfg = BertConfig.from_json(Path(config.init_from_hf, "config.json"))
        if config.model is not None and _load_model_arg(config.model, vocab) != cfg:
            raise ValueError(
                f"--model {config.model} differs from the config of --init-from-hf "
                f"{config.init_from_hf}; give only one of them"
            )
    else:
        cfg = _load_model_arg(config.model, vocab)  # TrainConfig: given without --init-from-hf
    if config.dropout is not None:
        cfg = dataclasses.replace(
            cfg, hidden_dropout_prob=config.dropout, attention_probs_dropout_prob=config.dropout
        )
    check_fit(cfg, manifest)
    return cfg


def check_fit(cfg: BertConfig, manifest: dict) -> None:
    """Refuse shards the model cannot read: another vocabulary or [PAD] id, longer rows.

    Raises:
        ValueError: naming both values.
    """
    shard_format.check_vocab_compat(
        manifest, vocab_size=cfg.vocab_size, special_ids={"pad": cfg.pad_token_id}
    )
    seq = manifest["schema"]["max_seq_length"]
    if seq > cfg.max_position_embeddings:
        raise ValueError(
            f"the shards have rows of up to {seq} tokens but the model has "
            f"max_position_embeddings {cfg.max_position_embeddings}"
        )


def check_eval_data(train: str, train_manifest: dict, held_out: str, manifest: dict) -> None:
    """Refuse held-out shards tokenized otherwise than the training shards: another vocab
    (its sha256, not only its size: two vocabs of one size give the same ids to other
    words, and the evaluation would score noise) or another casing.

    Args:
        train, held_out: the ``--data`` and ``--eval-data`` directories.
        train_manifest, manifest: their manifests.

    Raises:
        ValueError: naming both manifests, what differs and the build flags that fix it.
    """
    ours, theirs = train_manifest["vocab"], manifest["vocab"]
    differ = [key for key in ("sha256", "do_lower_case") if ours.get(key) != theirs.get(key)]
    if not differ:
        return
    what = {"sha256": "vocab", "do_lower_case": "casing (do_lower_case)"}
    shown = "; ".join(
        f"{what[key]}: {theirs.get(key)} in --eval-data, {ours.get(key)} in --data"
        for key in differ
    )
    raise ValueError(
        f"--eval-data {held_out} was tokenized otherwise than --data {train} ({shown}; "
        f"{held_out}/{shard_format.MANIFEST_NAME} against {train}/{shard_format.MANIFEST_NAME}"
        f"). Build the held-out set with the training shards' vocab: python -m pipeline build "
        f"--vocab_file {train}/{ours.get('file', 'vocab.txt')} --do_lower_case "
        f"{str(ours.get('do_lower_case')).lower()} ..."
    )


def check_resumed_precision(config: TrainConfig, ds: dict, directory: str, tag: str) -> None:
    """Refuse to resume in another precision than the checkpoint's (its ds_config.json):
    DeepSpeed's optimizer states differ (fp32 master weights in bf16/fp16, none in fp32).

    Raises:
        ValueError: naming both precisions and the --precision that resumes it.
    """
    path = Path(directory, tag, "ds_config.json")
    if not path.is_file():
        return
    saved, now = precision(json.loads(path.read_text())), precision(ds)
    if saved != now:
        raise ValueError(
            f"--resume {directory}/{tag} trained in {saved}, this run would train in {now} "
            f"(--precision {config.precision}, --ds-config {config.ds_config}); resume with "
            f"--precision {saved}"
        )


def check_resumed_model(config: TrainConfig, cfg: BertConfig, directory: str, tag: str) -> None:
    """Refuse to resume a checkpoint of another model: its config.json against ``cfg``.

    The dropout probabilities (``--dropout``) and initializer_range may change on resume. A
    universal checkpoint has no config.json and is not checked here.

    Raises:
        ValueError: naming --resume, the fields that differ (both values) and the flag that
            builds the checkpoint's model.
    """
    path = Path(directory, tag, "config.json")
    if not path.is_file():
        return
    saved = BertConfig.from_json(path)
    differ = _differences(saved, cfg)
    if not differ:
        return

    def show(c: BertConfig) -> str:
        return ", ".join(f"{name}={getattr(c, name)}" for name in differ)

    # TrainConfig requires one of them.
    built_by = (
        f"--model {config.model}"
        if config.model is not None
        else f"--init-from-hf {config.init_from_hf}"
    )
    afresh = "give a new --output-dir" if config.resume == "auto" else "leave out --resume"
    if set(differ) <= {"vocab_size", "pad_token_id"}:  # a preset takes them from --data
        advice = "Resume on the shards it was trained on (--data)"
    else:
        advice = f"Resume with {_model_flag(saved, path)}"
    raise ValueError(
        f"--resume {config.resume}: the checkpoint {directory}/{tag} is a model with "
        f"{show(saved)}; this run builds {show(cfg)} ({built_by}). {advice}, or {afresh} to "
        "start afresh"
    )


def check_resumed_data(config: TrainConfig, fingerprint: str, saved: dict, where: str) -> None:
    """Refuse to resume checkpoint ``where`` (its trainer state ``saved``) on other data.

    Raises:
        ValueError: the shards, their sha256, skipped shards or vocab differ (see
            :func:`data_fingerprint`), naming --data.
    """
    if saved.get("data_fingerprint") != fingerprint:
        raise ValueError(
            f"checkpoint {where} was trained on other data than --data {config.data} (shards, "
            "their sha256 or skipped shards differ): its data position would be meaningless, "
            "so it is not resumed"
        )


def batch_change(saved: dict, sizes: BatchSizes) -> str | None:
    """A warning when a resumed run trains another number of rows per optimizer step than
    the checkpoint's run did (another world size with the micro batch and accumulation steps
    fixed), else None.

    The data stream continues exactly either way (one global position, trainer/order.py);
    what changes is what a step means: --max-steps, warmup and decay count steps, and the
    learning rate is not rescaled.

    Example: ``({"world_size": 2, "micro_batch": 4, "gradient_accumulation_steps": 3, ...},
    BatchSizes(4, 3, 3))`` -> "... 24 rows per optimizer step ... this run trains 36 ...".
    """
    before = saved["world_size"] * saved["micro_batch"] * saved["gradient_accumulation_steps"]
    if before == sizes.per_step:
        return None
    more = "more" if sizes.per_step > before else "fewer"
    return (
        f"--resume: the checkpoint's run trained {before} rows per optimizer step "
        f"({saved['world_size']} ranks x micro batch {saved['micro_batch']} x "
        f"{saved['gradient_accumulation_steps']} accumulation steps), this run trains "
        f"{sizes.per_step} ({sizes.world_size} x {sizes.micro} x {sizes.accumulation}). The data "
        f"continues at row {saved['position']} of the stream, none lost or repeated, but "
        f"--max-steps and the learning-rate schedule count steps: the run will see {more} rows "
        f"than planned, at the same learning rates. To keep {before} rows per step, give the "
        f"--ds-config train_batch_size {before} without gradient_accumulation_steps (DeepSpeed "
        "derives them from the world size), or set gradient_accumulation_steps to fit"
    )


def schedule_change(directory: str, tag: str, ds: dict, config: TrainConfig) -> str | None:
    """A warning when a resumed run lays its learning-rate schedule over another length than
    the checkpoint's run did (another --max-steps or --max-minutes), else None.

    DeepSpeed's WarmupDecayLR keeps only its step count in a checkpoint, and the time budget
    only the time spent: the length is always this run's flags, so a longer run continues at
    the rate of the longer schedule (a jump up from the old one's), and a shorter one at a
    lower rate.

    Example: a checkpoint of ``--max-steps 100`` resumed with ``--max-steps 200`` -> "...
    decayed over 100 steps (--max-steps 100); this run decays it over 200 ...".
    """
    saved_ds, saved = (
        Path(directory, tag, "ds_config.json"),
        Path(directory, tag, "train_config.json"),
    )
    if not (saved_ds.is_file() and saved.is_file()):
        return None
    before_ds, before = json.loads(saved_ds.read_text()), json.loads(saved.read_text())

    def length(ds_: dict, minutes: float | None) -> str | None:
        if minutes is not None:
            return f"{minutes:g} minutes (--max-minutes {minutes:g})"
        scheduler = ds_.get("scheduler") or {}
        steps = scheduler.get("params", {}).get("total_num_steps")
        if scheduler.get("type") != "WarmupDecayLR" or not isinstance(steps, int):
            return None
        return f"{steps} steps (--max-steps {steps})"

    old, new = length(before_ds, before.get("max_minutes")), length(ds, config.max_minutes)
    if old is None or new is None or old == new:
        return None
    return (
        f"--resume {directory}/{tag}: the checkpoint's run decayed its learning rate over "
        f"{old}; this run decays it over {new}, so the rate changes at once to where the new "
        f"schedule has it. To continue the old schedule, resume with its flag"
    )


def _differences(a: BertConfig, b: BertConfig) -> list[str]:
    """Fields of two model configs that differ, those a resume may change left out."""
    return [
        f.name
        for f in dataclasses.fields(BertConfig)
        if f.name not in RESUMABLE_CHANGES and getattr(a, f.name) != getattr(b, f.name)
    ]


def _model_flag(saved: BertConfig, path: Path) -> str:
    """The --model that builds ``saved``: a preset's name where one does, else its config.json."""
    for name in PRESETS:
        vocab = {"vocab_size": saved.vocab_size, "pad_token_id": saved.pad_token_id}
        if not _differences(BertConfig.preset(name, **vocab), saved):
            return f"--model {name}"
    return f"--model {path}"


def _load_model_arg(model: str, vocab: dict) -> BertConfig:
    if model in PRESETS:
        return BertConfig.preset(
            model, vocab_size=vocab["size"], pad_token_id=vocab["special_ids"]["pad"]
        )
    if model.endswith(".json") or os.path.isfile(model):
        return BertConfig.from_json(model)
    raise ValueError(f"--model {model!r} is neither a preset {sorted(PRESETS)} nor a config.json")


def build_model(config: TrainConfig, cfg: BertConfig, device_type: str) -> BertForPreTraining:
    """The model, initialised identically on every rank (seeded), or loaded from --init-from-hf;
    unpadded or not as ``--unpad`` resolves on ``device_type`` (config.resolve_unpad)."""
    torch.manual_seed(derive_seed(config.seed, "init"))
    if config.init_from_hf is not None:
        logger.info("initial weights from %s", config.init_from_hf)
        model = BertForPreTraining(cfg)  # cfg: the directory's config, --dropout applied
        model.load_state_dict(load_hf(config.init_from_hf).state_dict())
    else:
        model = BertForPreTraining(cfg)
    # Every batch on the same path, whatever its padding: each rank's backward then hands
    # the gradients to ZeRO in the same order (model/bert.py, set_unpadded).
    unpad = resolve_unpad(config.unpad, device_type)
    if config.unpad == "auto":
        logger.info(
            "encoder: %s (--unpad auto on %s)", "unpadded" if unpad else "padded", device_type
        )
    model.set_unpadded(unpad, every_batch=True)
    return model


def param_groups(model: torch.nn.Module) -> list[dict]:
    """Parameters for the optimizer: biases and LayerNorm weights without weight decay.

    Google's BERT (and transformers' recipe) exempt them; the decayed group takes the
    ds-config's ``weight_decay``.
    """
    params = dict(model.named_parameters())
    decay, no_decay = param_group_names(list(params))
    return [
        {"params": [params[n] for n in decay]},
        {"params": [params[n] for n in no_decay], "weight_decay": 0.0},
    ]


def param_group_names(names: list[str]) -> tuple[list[str], list[str]]:
    """The parameter names of :func:`param_groups`' two groups, in order (decayed, not).

    Example: ``["a.weight", "a.bias", "LayerNorm.weight"]`` -> ``(["a.weight"], ["a.bias",
    "LayerNorm.weight"])``.
    """
    exempt = [n.endswith("bias") or "LayerNorm" in n for n in names]
    return (
        [n for n, e in zip(names, exempt, strict=True) if not e],
        [n for n, e in zip(names, exempt, strict=True) if e],
    )


def data_fingerprint(shards: ShardSet) -> str:
    """sha256 of what fixes the data order: shards (names, sha256, rows in use) and vocab."""
    entries = [
        (e["name"], e["sha256"], int(rows))
        for e, rows in zip(shards.manifest["shards"], shards.rows_per_shard, strict=True)
    ]
    blob = json.dumps([entries, shards.manifest["vocab"]["sha256"]], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()
