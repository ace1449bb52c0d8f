"""Helpers the tests share: a corpus generator, an in-process build, a one-rank trainer run.

Import them (``from tests.helpers import make_corpus``; pyproject.toml puts the repository
root on pytest's path); a test file never loads another test file.

This module imports no torch at the top (what needs model/ or trainer/ imports it inside
the function): tests/conftest.py loads it, and tests/pipeline runs on the base install
(``pip install -e .``, no torch; scripts/test.sh checks it). What is torch through and
through lives in tests/torch_helpers.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------- corpora

WORDS = (
    "the a of and to in is was for on that with as by at from his her their this "
    "river mountain city village forest history music science language people king "
    "queen war peace book school church river island north south east west ancient "
    "modern famous small large early late built founded known called named became "
    "rémy café naïve 東京 über"
).split()


def make_corpus(directory: Path, n_docs=120, n_files=3, seed=0) -> str:
    """Google's txt convention: one sentence per line, blank line between documents.

    Writes ``part-{i}.txt`` for i < n_files (document d in file d % n_files) and returns
    the glob of them, e.g. ``".../corpus/*.txt"``. The same arguments give the same bytes.
    """
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    files = [[] for _ in range(n_files)]
    for d in range(n_docs):
        sentences = []
        for _ in range(rng.randint(1, 12)):
            words = [rng.choice(WORDS) for _ in range(rng.randint(3, 25))]
            sentences.append(" ".join(words).capitalize() + rng.choice([".", "!", "?"]))
        files[d % n_files].append("\n".join(sentences) + "\n\n")
    for i, docs in enumerate(files):
        (directory / f"part-{i}.txt").write_text("".join(docs), encoding="utf-8")
    return str(directory / "*.txt")


def build_shards(tmp: Path, *, n_docs: int = 120, num_shards: int = 3, **options) -> Path:
    """Build a shard directory with ``python -m pipeline build`` (in-process) and return it.

    Defaults: vocab 200, dupe 3, seq 48, 3 shards (about 1,200 rows). ``options`` are more
    pipeline flags without the dashes, e.g. ``dupe_factor=1``; ``objective="mlm"`` gives
    unmasked MLM rows (one pass: no dupe factor) unless ``static_masks="true"``.
    """
    from pipeline.cli.main import main

    corpus = make_corpus(tmp / "corpus", n_docs=n_docs)
    flags = {"vocab_size": 200, "dupe_factor": 3, "max_seq_length": 48, "num_shards": num_shards}
    if options.get("objective") == "mlm" and str(options.get("static_masks")) != "true":
        flags.pop("dupe_factor")
    flags.update(options)
    argv = ["build", "--input", corpus, "--output", str(tmp / "shards")]
    for key, value in flags.items():
        argv += [f"--{key}", str(value)]
    assert main(argv) == 0
    return tmp / "shards"


# ----------------------------------------------------------------------------- trainer runs

# The trainer tests' model: vocab 200 as the shards above, seq <= 64.
TINY = {
    "vocab_size": 200,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}


# The model/ head and HF-directory tests' model: a vocab (211) and widths no preset has.
HEADS_MODEL = {
    "vocab_size": 211,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 96,
    "max_position_embeddings": 40,
}


def write_json(path: Path, obj) -> str:
    path.write_text(json.dumps(obj))
    return str(path)


def model_json(tmp_path, **overrides) -> str:
    """A config.json of TINY with ``overrides``; returns its path."""
    from model import BertConfig

    return write_json(tmp_path / "model.json", BertConfig(**{**TINY, **overrides}).to_dict())


CPU_DS = REPO / "deploy" / "cpu.json"  # the DeepSpeed config every CPU test run starts from


def cpu_ds(**overrides) -> dict:
    """deploy/cpu.json with its top-level keys replaced by ``overrides``, e.g.
    ``cpu_ds(train_micro_batch_size_per_gpu=8)``; a fresh dict, the file is left alone."""
    return {**json.loads(CPU_DS.read_text()), **overrides}


def write_cpu_ds(path: Path, **overrides) -> str:
    """:func:`cpu_ds` of ``overrides`` written to ``path``; returns its path."""
    return write_json(path, cpu_ds(**overrides))


def ds_json(tmp_path, **overrides) -> str:
    """deploy/cpu.json with the tests' batch of 8 and ``overrides`` as ``tmp_path/ds.json``;
    returns its path."""
    return write_cpu_ds(tmp_path / "ds.json", **{"train_micro_batch_size_per_gpu": 8, **overrides})


def args(tmp_path, data, *extra, **ds) -> list[str]:
    """trainer/run.py's arguments for TINY on ``data``, output in ``tmp_path / "out"``."""
    return [
        "--ds-config",
        ds_json(tmp_path, **ds),
        "--data",
        str(data),
        "--model",
        model_json(tmp_path),
        "--output-dir",
        str(tmp_path / "out"),
        "--num-workers",
        "0",
        "--plots",  # only tests that check plots make them: costly beside a short run
        "false",
        *extra,
    ]


def records(out: Path, split="train") -> list[dict]:
    """The ``split`` records of a run's metrics.jsonl."""
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


# ----------------------------------------------------------------------------- fine-tuning

FINETUNE_WORDS = [f"w{i}" for i in range(20)]  # a vocabulary of whole words: no word pieces
DIGITS = [str(i) for i in range(10)]


def make_finetune_init(path: Path) -> Path:
    """A random-init tiny BertForPreTraining HF directory with a vocab.txt, dropout off
    (hidden 64, 2 layers, seq <= 64), for ``python -m finetune --init``."""
    import torch

    from model import BertConfig, BertForPreTraining
    from pipeline.core.vocab import SPECIAL_TOKENS, write_vocab

    torch.manual_seed(0)
    vocab = [*SPECIAL_TOKENS, *FINETUNE_WORDS, *DIGITS, "digit", "##w"]
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    BertForPreTraining(config).save_hf(path)
    write_vocab(path / "vocab.txt", vocab)
    return path


def has_digit(rng, n):
    """Sentence pairs; label: is there a digit in either segment (balanced)."""
    rows = []
    for i in range(n):
        words = rng.sample(FINETUNE_WORDS, 8)
        if i % 2:
            words[rng.randrange(8)] = rng.choice(DIGITS)
        label = "yes" if i % 2 else "no"
        rows.append({"text": " ".join(words[:5]), "text_pair": " ".join(words[5:]), "label": label})
    return rows


def digit_tags(rng, n):
    """Tag every digit token DIGIT, everything else O."""
    rows = []
    for _ in range(n):
        k = rng.randint(4, 12)
        tokens = [
            rng.choice(DIGITS) if rng.random() < 0.3 else rng.choice(FINETUNE_WORDS)
            for _ in range(k)
        ]
        rows.append({"tokens": tokens, "tags": ["DIGIT" if t.isdigit() else "O" for t in tokens]})
    return rows


def find_digit(rng, n):
    """Question "digit"; the answer is the one digit in a context of 6-13 words."""
    rows = []
    for _ in range(n):
        words = rng.sample(FINETUNE_WORDS, rng.randint(5, 12))
        at = rng.randrange(len(words) + 1)
        words.insert(at, rng.choice(DIGITS))
        start = len(" ".join(words[:at])) + (1 if at else 0)
        answers = {"text": [words[at]], "answer_start": [start]}
        rows.append({"question": "digit", "context": " ".join(words), "answers": answers})
    return rows


def write_jsonl(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def same_topic(rng, n, k=4):
    """Sentence pairs of ``k`` words; the words w0..w9 are one topic, w10..w19 another.
    ``text`` is on one topic; score: the share of text_pair's words on the same topic,
    in 0..5 (STS-B's range)."""
    topics = (FINETUNE_WORDS[:10], FINETUNE_WORDS[10:])
    rows = []
    for _ in range(n):
        topic = rng.randrange(2)
        same = rng.randint(0, k)
        text = rng.sample(topics[topic], k)
        pair = rng.sample(topics[topic], same) + rng.sample(topics[1 - topic], k - same)
        rng.shuffle(pair)
        score = 5.0 * same / k
        rows.append({"text": " ".join(text), "text_pair": " ".join(pair), "score": score})
    return rows


# ----------------------------------------------------------------------------- launches


def free_port() -> int:
    """A TCP port free on this machine now (for a launcher's --master_port)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_launch_files(files: Path, ds_name: str = "ds.json", **ds_overrides) -> None:
    """``files/model.json`` (TINY) and ``files/DS_NAME`` (deploy/cpu.json with a micro batch
    of 4 and ``ds_overrides``): what the launch tests' runs read."""
    from model import BertConfig

    write_json(files / "model.json", BertConfig(**TINY).to_dict())
    write_cpu_ds(files / ds_name, **{"train_micro_batch_size_per_gpu": 4, **ds_overrides})


def sample_lines(out: Path, ranks: int) -> list[list[list[int]]]:
    """Per rank, the micro-batches a --record-samples run recorded: [optimizer step, row ids...]."""
    files = [out / f"samples-rank{rank}.txt" for rank in range(ranks)]
    return [[list(map(int, line.split())) for line in f.read_text().splitlines()] for f in files]


def interleave(per_rank: list[list[list[int]]]) -> list[list[int]]:
    """Micro-batches in stream order: micro-step by micro-step, rank 0 first."""
    return [batch for group in zip(*per_rank, strict=True) for batch in group]


def max_weight_difference(a: Path, b: Path, tag: str) -> float:
    """max |w_a - w_b| over the consolidated fp32 weights of checkpoint ``tag`` of two runs."""
    from trainer import export

    left = export.consolidated_state_dict(str(a / "checkpoints"), tag)
    right = export.consolidated_state_dict(str(b / "checkpoints"), tag)
    assert left.keys() == right.keys()
    return max((left[k] - right[k]).abs().max().item() for k in left)


FAULTS = REPO / "tests" / "faults"  # fault_injection.py, loaded through its sitecustomize


def rank_env(fault: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a launched CPU run; ``fault``: ``KIND@STEP[:RANK]`` injected into
    its ranks (tests/faults/fault_injection.py), e.g. ``"sigkill@6:1"``. A sitecustomize of
    ``extra``'s PYTHONPATH comes first and must import ``fault_injection`` itself."""
    import os

    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", **extra}
    env.pop("BERT_TEST_FAULT", None)
    if fault is not None:
        path = [env.get("PYTHONPATH", ""), str(FAULTS)]  # another sitecustomize first
        env.update(BERT_TEST_FAULT=fault, PYTHONPATH=os.pathsep.join(filter(None, path)))
    return env


def trainer_argv(
    files: Path, data: Path, out: Path, *extra: str, steps: int, save_every: int, ds="ds.json"
) -> list[str]:
    """trainer/run.py's arguments for a launch test's run (files: write_launch_files')."""
    return [
        "trainer/run.py",
        "--ds-config",
        str(files / ds),
        "--data",
        str(data),
        "--model",
        str(files / "model.json"),
        "--output-dir",
        str(out),
        "--max-steps",
        str(steps),
        "--save-every",
        str(save_every),
        "--log-every",
        "2",
        "--num-workers",
        "1",
        "--record-samples",
        "true",
        "--export-hf",
        "false",
        "--plots",  # only tests that check plots make them: costly beside a short run
        "false",
        *extra,
    ]


def launch(
    files: Path,
    data: Path,
    out: Path,
    *extra: str,
    steps: int,
    save_every: int,
    ranks=2,
    fault=None,
    ds="ds.json",
    port=None,
    timeout=300,
):
    """trainer/run.py on ``ranks`` CPU ranks of this machine (one: without a launcher);
    ``port``: the launcher's --master_port (default: a free one); ``fault``: see
    :func:`rank_env` (when it strikes is appended to ``OUT.faults``); ``timeout``: seconds
    (a run that compiles, --compile, takes minutes more on a loaded machine)."""
    import shutil
    import sys

    argv = trainer_argv(files, data, out, *extra, ds=ds, steps=steps, save_every=save_every)
    if ranks > 1:
        cmd = [
            shutil.which("deepspeed") or "deepspeed",
            "--num_gpus",
            str(ranks),
            "--master_port",
            str(port or free_port()),
            *argv,
        ]
    else:
        cmd = [sys.executable, *argv]
    return run_group(cmd, env=rank_env(fault, BERT_TEST_FAULT_LOG=f"{out}.faults"), timeout=timeout)


def run_group(cmd: list[str], *, env: dict[str, str], timeout: float):
    """``subprocess.run(cmd, capture_output=True, text=True)`` in REPO, in a process group of
    its own that is killed whole at ``timeout`` (then TimeoutExpired is raised).

    subprocess.run's own timeout kills the launcher alone and then waits for the pipes,
    which its ranks hold open: a hung run kept the test waiting for the ranks' collective
    timeout (10 minutes), not for ``timeout``.
    """
    import os
    import signal
    import subprocess

    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def sha256_files(directory: Path, names) -> dict[str, str]:
    """``{name: sha256 hex of directory/name}`` for each of ``names``."""
    import hashlib

    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in names}


def assert_golden(actual: dict, expected: dict, how_to_update: str, **fields) -> None:
    """``actual == expected``, else the golden test's ``how_to_update`` text, filled with
    ``fields`` and both sides as JSON (``{expected}``, ``{got}``), as its failure."""
    import json

    got, want = json.dumps(actual, indent=2), json.dumps(expected, indent=2)
    assert actual == expected, how_to_update.format(expected=want, got=got, **fields)
