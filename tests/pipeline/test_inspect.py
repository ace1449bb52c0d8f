"""pipeline/cli/inspect_cli.py decode_row: WordPieces as masked, or joined into words."""

import numpy as np

from pipeline.cli.inspect_cli import decode_row

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "ri", "##ver", "flows", "##s"]


def row(ids, positions, targets):
    return {
        "input_ids": np.array(ids),
        "masked_lm_positions": np.array(positions),
        "masked_lm_ids": np.array(targets),
    }


def test_wordpieces_by_default_words_on_request():
    # [CLS] the ri ##ver [MASK] [SEP], position 4 masked with target "flows"
    r = row([2, 5, 6, 7, 4, 3], [4], [8])
    assert decode_row(r, VOCAB) == "[CLS] the ri ##ver [[MASK]>flows] [SEP]"
    assert decode_row(r, VOCAB, words=True) == "[CLS] the river [[MASK]>flows] [SEP]"


def test_masked_pieces_stay_apart_when_joining_words():
    # "ri [##ver masked]" then "flows" kept as "flows" + a masked "##s", then "##s" after a mask
    r = row([2, 6, 4, 8, 9, 9, 3], [2, 4], [7, 9])
    assert decode_row(r, VOCAB) == "[CLS] ri [[MASK]>##ver] flows [##s>##s] ##s [SEP]"
    assert decode_row(r, VOCAB, words=True) == "[CLS] ri [[MASK]>##ver] flows [##s>##s] ##s [SEP]"
    # Unmasked pieces on both sides join; a piece at the start has nothing to join.
    assert decode_row(row([7, 6, 7, 9], [], []), VOCAB, words=True) == "##ver rivers"
