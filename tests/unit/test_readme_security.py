"""Every wall the security model (docs/security.md) names has the test it cites.

The section cites tests as ``dir/file.py::test_name`` (later ones in the same
cell as ``::test_name``) or a whole file as ``dir/file.py``; each must exist,
so the document cannot drift from the tests that back it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITE = re.compile(r"`([\w/]+\.py)?(?:::(\w+))?`")


def security_model() -> str:
    return (ROOT / "docs" / "security.md").read_text()


def citations() -> list[tuple[str, str | None]]:
    cited: list[tuple[str, str | None]] = []
    for line in security_model().splitlines():
        if not line.startswith("|"):
            continue
        current = None
        for path, name in CITE.findall(line.rsplit("|", 2)[-2]):
            current = path or current
            if current:
                cited.append((current, name or None))
    return cited


def test_the_security_model_cites_tests_that_exist() -> None:
    cited = citations()
    assert len(cited) >= 40, cited
    missing = []
    for path, name in cited:
        source = ROOT / "tests" / path
        if not source.is_file():
            missing.append(path)
        elif name and not re.search(rf"^(async )?def {name}\(", source.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert not missing, f"cited but missing: {missing}"
