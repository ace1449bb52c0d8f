"""``python -m pipeline build|stats|inspect|validate|export ...``: pipeline/cli/main.py."""

import sys

from pipeline.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
