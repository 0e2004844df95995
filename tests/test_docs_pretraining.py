"""Every ```python block of docs/pretraining.md runs, in order, in one namespace."""
from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def blocks(path: str) -> list[str]:
    text = open(path, encoding="utf-8").read()
    out = []
    for match in re.finditer(r"(<!-- no-run:[^>]*-->\s*)?```python\n(.*?)```", text, re.S):
        if match.group(1) is None:
            out.append(match.group(2))
    return out


def test_pretraining_guide_snippets_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = blocks(os.path.join(ROOT, "docs", "pretraining.md"))
    assert len(found) >= 4
    namespace: dict = {}
    for code in found:
        exec(compile(code, "docs/pretraining.md", "exec"), namespace)
