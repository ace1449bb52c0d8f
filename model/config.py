"""BERT configuration: named presets and Hugging Face ``config.json`` I/O.

Field names are those of Hugging Face's ``BertConfig`` so that a ``config.json``
written here is read by ``transformers`` and the other way round::

    cfg = BertConfig.preset("base")
    cfg.to_json("out/config.json")
    assert BertConfig.from_json("out/config.json") == cfg
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.shards.shard_writer import atomic_write_bytes

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")

# (num_hidden_layers, hidden_size, num_attention_heads); intermediate is 4 x hidden.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

# Keys that Hugging Face writes into config.json but that do not change this
# model; accepted on read and ignored. Anything else unknown is an error.
_HF_METADATA_KEYS = frozenset(
    {
        "_name_or_path",
        "add_cross_attention",
        "architectures",
        "bos_token_id",
        "chunk_size_feed_forward",
        "classifier_dropout",
        "dtype",
        "eos_token_id",
        "gradient_checkpointing",
        "id2label",
        "is_decoder",
        "label2id",
        "model_type",
        "output_attentions",
        "output_hidden_states",
        "position_embedding_type",
        "problem_type",
        "return_dict",
        "tie_word_embeddings",
        "torch_dtype",
        "transformers_version",
        "use_cache",
    }
)


@dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT encoder with pretraining heads.

    Defaults are BERT-Base (L=12, H=768, A=12, 110M parameters).
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"  # "gelu" is the exact erf form, as in the reference
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0  # its embedding row starts at zero and gets no gradient

    def __post_init__(self) -> None:
        positive = (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        )
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {ACTIVATIONS}, got {self.hidden_act!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if self.initializer_range <= 0 or self.layer_norm_eps <= 0:
            raise ValueError("initializer_range and layer_norm_eps must be > 0")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"pad_token_id must be in [0, vocab_size={self.vocab_size}), got {self.pad_token_id}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def training_flops(
        self, tokens: float, attended: float, predictions: float, rows: float
    ) -> float:
        """FLOPs of the matmuls of one training step (forward + backward = 3 x forward).

        ``tokens`` pass every Linear of every layer (2 x (4H² + 2HI) each), ``attended``
        query-key pairs cost 4H per layer (scores and the weighted sum), ``predictions``
        rows pass the MLM head (2 x (H² + HV)), and ``rows`` sequences the pooler and NSP
        (2 x (H² + 2H)). Callers say what each count is: real tokens or every position,
        per-row or grid attention, real predictions or every slot.
        """
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        encoder = self.num_hidden_layers * (2 * tokens * (4 * h * h + 2 * h * i) + 4 * attended * h)
        heads = 2 * predictions * (h * h + h * v) + 2 * rows * (h * h + 2 * h)
        return 3.0 * (encoder + heads)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        """A named size (tiny, mini, small, medium, base, large), optionally overridden.

        Raises:
            ValueError: unknown preset name or unknown override key.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        layers, hidden, heads = PRESETS[name]
        fields = {
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "intermediate_size": 4 * hidden,
        }
        return cls.from_dict({**fields, **overrides})

    @classmethod
    def from_dict(
        cls, values: dict[str, Any], *, source: str = "config", complete: bool = False
    ) -> BertConfig:
        """Build from a dict with Hugging Face field names.

        HF metadata keys (``architectures``, ``transformers_version``, ...) are
        ignored. Missing fields take the defaults unless ``complete`` is set.

        Raises:
            ValueError: an unknown key, a missing key when ``complete``, or
                ``position_embedding_type`` other than "absolute" (the only kind
                this model implements).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names - _HF_METADATA_KEYS)
        if unknown:
            raise ValueError(f"{source}: unknown key(s) {unknown}; known keys: {sorted(names)}")
        # pad_token_id may be absent from old configs; its default is the reference's.
        missing = sorted(names - set(values) - {"pad_token_id"}) if complete else []
        if missing:
            raise ValueError(f"{source}: missing key(s) {missing}")
        kind = values.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(f"{source}: position_embedding_type {kind!r} is not supported")
        return cls(**{k: v for k, v in values.items() if k in names})

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> BertConfig:
        """Read a Hugging Face style ``config.json``; every model field must be present.

        Raises:
            ValueError: unreadable JSON, or an invalid, unknown or missing field
                (the message names the file).
        """
        try:
            values = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read model config {path}: {e}") from e
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a JSON object")
        return cls.from_dict(values, source=str(path), complete=True)

    def to_dict(self) -> dict[str, Any]:
        """Fields plus the metadata ``transformers`` needs to pick the class."""
        return {
            **dataclasses.asdict(self),
            "architectures": ["BertForPreTraining"],
            "model_type": "bert",
            "position_embedding_type": "absolute",
            "tie_word_embeddings": True,
        }

    def to_json(self, path: str | os.PathLike) -> None:
        """Write ``config.json`` atomically (temp file, then rename)."""
        write_text_atomic(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (pipeline/shards/shard_writer.py
    ``atomic_write_bytes``, the project's one atomic writer)."""
    atomic_write_bytes(path, text.encode("utf-8"))
