"""The old name of ``pipeline/shard_format.py`` (the shard reader), kept for compatibility.

External readers may ``from pipeline import format`` and ``pipeline/FORMAT.md`` documents
``python -m pipeline.format DIR`` (an alias of ``python -m pipeline validate DIR``), so this
module re-exports the reader's public names and runs its ``main``. New code imports
``pipeline.shard_format``.
"""

import sys

from . import shard_format
from .shard_format import *  # noqa: F403
from .shard_format import main

__all__ = shard_format.__all__

if __name__ == "__main__":
    sys.exit(main())
