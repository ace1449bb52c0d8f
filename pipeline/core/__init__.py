"""Beam-free algorithms: text, sources, WordPiece, vocab, NSP, masking, seeds, rows."""
