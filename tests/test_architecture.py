"""ARCHITECTURE.md stays true: every module and file it names exists, and it stays short."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")


def test_every_path_it_names_exists():
    paths = set(
        re.findall(r"`((?:pipeline|trainer|model|finetune|report|deploy|tests)/[\w/.]*)`", TEXT)
    )
    assert len(paths) > 40
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, missing


def test_every_name_it_gives_a_module_is_defined_there():
    named = re.findall(r"`(\w+)` \(`([\w/]+\.py)`\)", TEXT)
    assert len(named) >= 2
    for name, path in named:
        assert re.search(rf"^(?:def|class)? ?{name}\b", (ROOT / path).read_text(), re.M), (
            name,
            path,
        )


def test_it_is_short():
    assert len(TEXT.splitlines()) < 150
