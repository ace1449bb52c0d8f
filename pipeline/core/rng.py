"""Deterministic random number generators seeded from stable values.

Every random choice in the pipeline (NSP pairs, masking, shard placement) is
seeded from values that are the same on every runner, worker and process: the
run's seed, a document's id string, the dupe index, an instance index. That is
what makes the same input and seed give byte-identical shards whatever the
runner or the number of workers.

Python's built-in ``hash()`` of a ``str`` is salted per process
(``PYTHONHASHSEED``), and time or worker ids differ between runs, so neither may
ever reach a seed. Instead the parts are encoded unambiguously and hashed with
SHA-256:

    derive_seed(42, "9f2c...e1:0", 3)  # same value on every machine, forever

A document's id is its content hash (``sources.content_id``); its bucket is
``derive_seed(seed, "bucket", content_id) % num_buckets``; in the bucket, copies of one
document are numbered (``doc_id = f"{content_id}:{n}"``); then per dupe pass
(pipeline/beam/instance_steps.py):

    rng = python_rng(seed, "nsp", doc_id, dupe_index)   # random.Random: the NSP pairs
    keys = shard_keys(seed, doc_id, dupe_index, count)  # uint64, one per row: the row's
    # shard (keys[i] % num_shards), its place in the shard and its masks (masking.mask_flat)
    keys[i] == shard_key(seed, doc_id, dupe_index, i)   # one at a time

The trainer tags its own seeds: "shard_order", "window", "dynamic", "dropout", "init".
"""

from __future__ import annotations

import hashlib
import operator
import random
from collections.abc import Sequence

import numpy as np

# Bumping this changes every seed (and so every shard): do it only on purpose.
_ENCODING_VERSION = b"bert-pipeline/derive_seed/v1\x00"
_TAG_INT = b"i"
_TAG_STR = b"s"


def _encode_part(part: int | str) -> bytes:
    """Encodes one part as ``tag + 8-byte big-endian length + payload``.

    A type tag keeps ``1`` and ``"1"`` apart; the length prefix keeps
    ``("ab", "c")`` and ``("a", "bc")`` apart. Ints are encoded as minimal
    two's-complement big-endian bytes, so any size and sign is allowed.

    Args:
        part: a ``str`` (UTF-8 encoded) or an integer (``int`` or a numpy
            integer; anything with ``__index__``), but not a ``bool``.

    Returns:
        The encoded bytes.

    Raises:
        TypeError: ``part`` is a ``bool`` or neither a ``str`` nor an integer.
    """
    if isinstance(part, str):
        tag, payload = _TAG_STR, part.encode("utf-8")
    elif isinstance(part, (bool, np.bool_)):
        # True == 1 would silently alias the int 1: almost surely a bug upstream.
        raise TypeError(f"seed parts must be int or str, got bool {part!r}")
    else:
        try:
            value = operator.index(part)
        except TypeError:
            raise TypeError(
                f"seed parts must be int or str, got {type(part).__name__} {part!r}"
            ) from None
        tag = _TAG_INT
        payload = value.to_bytes(value.bit_length() // 8 + 1, "big", signed=True)
    return tag + len(payload).to_bytes(8, "big") + payload


def derive_seed(*parts: int | str) -> int:
    """Derives a 64-bit unsigned seed from stable parts via SHA-256.

    The parts are type-tagged and length-prefixed before hashing, so distinct
    part tuples give distinct byte strings (and, short of a SHA-256 collision
    in the first 64 bits, distinct seeds). The result is the first 8 bytes of
    the digest read as a big-endian unsigned integer.

    Worked example (known-answer; see tests/pipeline/test_rng.py):

        derive_seed(12345, "doc-0", 0)  ->  17840439719599173864

    Args:
        *parts: one or more ``int`` or ``str`` values, e.g. ``(seed, doc_id,
            dupe_index)``. Order matters.

    Returns:
        An int in ``[0, 2**64)``.

    Raises:
        ValueError: no parts were given.
        TypeError: a part is not an ``int`` or ``str`` (bools are refused).
    """
    if not parts:
        raise ValueError("derive_seed needs at least one part, got none")
    digest = hashlib.sha256(_ENCODING_VERSION)
    for part in parts:
        digest.update(_encode_part(part))
    return int.from_bytes(digest.digest()[:8], "big")


def derive_seeds(prefix: tuple[int | str, ...], last: Sequence[int | str]) -> list[int]:
    """``[derive_seed(*prefix, x) for x in last]``, hashing the prefix once.

    Example: ``derive_seeds((12345, "doc-0"), [0])[0] == 17840439719599173864``.

    Raises:
        TypeError: a part is not an ``int`` or ``str``.
    """
    head = hashlib.sha256(_ENCODING_VERSION)
    for part in prefix:
        head.update(_encode_part(part))
    seeds = []
    for part in last:
        digest = head.copy()
        digest.update(_encode_part(part))
        seeds.append(int.from_bytes(digest.digest()[:8], "big"))
    return seeds


def derive_seed_grid(
    prefix: tuple[int | str, ...], middles: Sequence[int | str], lasts: Sequence[int | str]
) -> list[list[int]]:
    """``[[derive_seed(*prefix, m, x) for x in lasts] for m in middles]``, each part
    encoded once: e.g. every dupe pass of every document of a bucket.

    Example: ``derive_seed_grid((12345,), ["doc-0"], [0]) == [[17840439719599173864]]``.

    Raises:
        TypeError: a part is not an ``int`` or ``str``.
    """
    head = hashlib.sha256(_ENCODING_VERSION)
    for part in prefix:
        head.update(_encode_part(part))
    encoded_lasts = [_encode_part(x) for x in lasts]
    grid = []
    for middle in middles:
        mid = head.copy()
        mid.update(_encode_part(middle))
        row = []
        for encoded in encoded_lasts:
            digest = mid.copy()
            digest.update(encoded)
            row.append(int.from_bytes(digest.digest()[:8], "big"))
        grid.append(row)
    return grid


def python_rng(*parts: int | str) -> random.Random:
    """Returns a ``random.Random`` seeded with ``derive_seed(*parts)``.

    The NSP step uses this generator, as Google's ``create_pretraining_data.py``
    does, seeded with ``(seed, "nsp", doc_id, dupe_index)``.

    Args:
        *parts: as for :func:`derive_seed`.

    Returns:
        A fresh ``random.Random``.

    Raises:
        ValueError, TypeError: as for :func:`derive_seed`.
    """
    return random.Random(derive_seed(*parts))


def numpy_rng(*parts: int | str) -> np.random.Generator:
    """Returns a numpy ``Generator`` (PCG64) seeded with ``derive_seed(*parts)``.

    Args:
        *parts: as for :func:`derive_seed`.

    Returns:
        A fresh ``numpy.random.Generator`` backed by ``PCG64``.

    Raises:
        ValueError, TypeError: as for :func:`derive_seed`.
    """
    return np.random.Generator(np.random.PCG64(derive_seed(*parts)))


def shard_key(seed: int, doc_id: str, dupe_index: int, instance_index: int) -> int:
    """Returns the 64-bit key that places one instance among the shards.

    The pipeline writes the instance to shard ``key % num_shards``, sorts each
    shard by key and masks the row with randomness drawn from the key
    (``pipeline.core.masking.mask_flat``), so instances of one document are scattered
    over shards and over positions within a shard, identically on every runner.
    The parts are prefixed with the tag ``"shard_key"`` so the key never equals a
    seed derived for another purpose from the same values.

    Args:
        seed: the run's seed.
        doc_id: the document's id (its content hash and copy number).
        dupe_index: the dupe pass, in ``[0, dupe_factor)``.
        instance_index: the instance's index within that document and pass.

    Returns:
        An int in ``[0, 2**64)``.

    Raises:
        TypeError: a part has the wrong type (see :func:`derive_seed`).
    """
    return int(shard_keys(seed, doc_id, dupe_index, instance_index + 1)[-1])


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 [N] (wrapping arithmetic): a bijection that
    turns consecutive integers into well-mixed 64-bit values."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def shard_key_base(seed: int, doc_id: str, dupe_index: int) -> int:
    """The 64-bit base of one document's and dupe pass's instance keys."""
    return derive_seed("shard_key", seed, doc_id, dupe_index)


def keys_from_bases(bases: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Instance keys for many (document, pass) groups at once.

    Group ``g`` has ``counts[g]`` instances whose keys are
    ``splitmix64(bases[g] + i)`` for ``i`` in ``0 .. counts[g] - 1``.

    Args:
        bases: uint64 ``[G]`` from :func:`shard_key_base`.
        counts: int ``[G]``.

    Returns:
        uint64 ``[sum(counts)]``, group by group.
    """
    counts = np.asarray(counts, dtype=np.int64)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    index = (np.arange(int(counts.sum())) - starts).astype(np.uint64)
    with np.errstate(over="ignore"):
        return splitmix64(np.repeat(np.asarray(bases, dtype=np.uint64), counts) + index)


def shard_keys(seed: int, doc_id: str, dupe_index: int, count: int) -> np.ndarray:
    """The keys of instances ``0 .. count - 1`` of one document and dupe pass.

    One SHA-256 per (seed, document, pass), then SplitMix64 of that base plus the
    instance index: as stable as :func:`derive_seed`, without a hash per instance.

    Returns:
        uint64 ``[count]``; ``shard_keys(...)[i] == shard_key(..., i)``.
    """
    base = shard_key_base(seed, doc_id, dupe_index)
    return keys_from_bases(np.array([base], dtype=np.uint64), np.array([count]))
