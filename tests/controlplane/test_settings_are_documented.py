"""Every environment variable ``controlplane/settings.py`` reads is in the README's configuration table."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_setting_read_from_the_environment_is_documented():
    settings_py = (ROOT / "controlplane" / "settings.py").read_text()
    names = set(re.findall(r'env(?:\.\w+)?\(\s*"([A-Z][A-Z0-9_]+)"', settings_py))
    assert len(names) > 40  # the pattern still finds them
    table = (ROOT / "README.md").read_text().split("## Configuration", 1)[1]
    assert sorted(n for n in names if f"`{n}`" not in table) == []
