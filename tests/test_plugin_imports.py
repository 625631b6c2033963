"""A plugin that exits or hangs at import is reported as failed, never takes the CLI down with it
(`raise SystemExit(7)` made `mas-lab envs` and `mas-lab config` exit 7 silently; a sleeping import hung)."""

import sys
from importlib.metadata import EntryPoint

import pytest

from mas_lab import envs
from mas_lab.envs import Registry


@pytest.mark.parametrize(
    "body, said",
    [
        ("raise SystemExit(7)", "exit(7)"),
        ("import time\ntime.sleep(60)", "did not finish in 0.5 s"),
        ("raise ValueError('bad')", "ValueError: bad"),
    ],
    ids=["exits", "hangs", "raises"],
)
def test_a_plugin_that_fails_at_import_is_reported(tmp_path, monkeypatch, body, said):
    module = f"plugin_{abs(hash(body))}"
    (tmp_path / f"{module}.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    point = EntryPoint(name="broken", value=f"{module}:Env", group=envs.ENTRY_POINTS)
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [point])
    monkeypatch.setattr(envs, "PLUGIN_IMPORT_S", 0.5)
    registry = Registry({})
    assert "broken" not in registry
    assert said in registry.failed["broken"]
    sys.modules.pop(module, None)
