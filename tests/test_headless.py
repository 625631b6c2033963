"""The core never imports textual."""
import re

from conftest import ROOT


def test_core_does_not_import_textual():
    pattern = re.compile(r"^\s*(import|from)\s+textual", re.MULTILINE)
    offenders = [str(p) for p in (ROOT / "mas_lab").rglob("*.py") if pattern.search(p.read_text())]
    assert offenders == []
