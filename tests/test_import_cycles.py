"""No import cycles between Conduit's modules, as the project's import-cycle tool counts them
(imports inside functions count; imports under ``if TYPE_CHECKING:`` do not).

The tool lives outside the package (``../shared/tools/import_cycles.py`` from the repository root,
or the path in ``CONDUIT_IMPORT_CYCLES_TOOL``); where it is absent the test is skipped, saying why.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = Path(os.environ.get("CONDUIT_IMPORT_CYCLES_TOOL") or ROOT.parent / "shared" / "tools" / "import_cycles.py")


def run_tool(monkeypatch, capsys) -> tuple[int, list[str], str]:
    """Run the tool's logic on ``conduit`` in this process: (exit status, each cycle by name, output)."""
    spec = importlib.util.spec_from_file_location("_conduit_import_cycles_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, "argv", [str(TOOL), "conduit"])
    monkeypatch.chdir(ROOT)
    try:
        spec.loader.exec_module(module)
        status = 0
    except SystemExit as exc:
        status = exc.code or 0
    out = capsys.readouterr().out
    cycles = [line.removeprefix("cycle:").strip() for line in out.splitlines() if line.startswith("cycle:")]
    return status, cycles, out


@pytest.mark.skipif(not TOOL.is_file(), reason=f"import-cycle tool not found at {TOOL} "
                                               "(set CONDUIT_IMPORT_CYCLES_TOOL to its path)")
def test_no_import_cycles(monkeypatch, capsys):
    status, cycles, out = run_tool(monkeypatch, capsys)
    assert "import cycles among" in out, f"the tool printed no summary:\n{out}"
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n".join(f"  {c}" for c in cycles)
    assert status == 0, out
