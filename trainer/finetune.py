"""Deprecated name of ``python -m finetune`` (fine-tuning moved to its own package).

    python -m trainer.finetune ...   # still works in 0.1.x: logs a warning, then runs
    python -m finetune ...           # the command to use

Kept for one release; removed in the release after 0.1.0. Importing ``FinetuneConfig``,
``run`` or ``parse_config`` from here still works too, without the warning.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from finetune.__main__ import main as _main
from finetune.config import FinetuneConfig as FinetuneConfig
from finetune.config import parse_config as parse_config
from finetune.train import run as run

logger = logging.getLogger(__name__)

DEPRECATION = (
    "python -m trainer.finetune is deprecated and goes away in the release after 0.1.0: "
    "use python -m finetune (same flags)"
)


def main(argv: Sequence[str] | None = None) -> int:
    """``finetune.__main__.main`` after a logged deprecation warning."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logger.warning(DEPRECATION)
    return _main(argv)


if __name__ == "__main__":
    sys.exit(main())
