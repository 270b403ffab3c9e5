"""The README's and docs' simulated figures are the committed result files' (``studies/update_docs.py``).

The first test is the guard: every generated block in ``README.md`` and ``docs/*.md`` equals what
its result file says, so a study rerun without ``python studies/update_docs.py`` (or a figure edited
by hand) fails the fast suite. The others check the block machinery: markers pair up, text outside
the blocks is never touched, a rewrite is idempotent, bad input is named, and a rendering carries
its figures from the file and never puts the design target in the headline table.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.studies import load_script

ROOT = Path(__file__).resolve().parents[1]
docs = load_script(ROOT / "studies" / "update_docs.py")


def test_generated_blocks_equal_the_committed_results():
    changed = docs.update(ROOT, write=False)
    assert not changed, ("generated blocks differ from results/: run `python studies/update_docs.py` and commit: "
                         + ", ".join(str(p.relative_to(ROOT)) for p in changed))


def test_readme_holds_every_block_once():
    text = (ROOT / "README.md").read_text()
    assert sorted(s.name for s in docs.find_blocks(text, "README.md")) == sorted(docs.BLOCKS)


_plain_line = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e"
                                    "\x85\u2028\u2029"), max_size=30).filter(lambda t: "GENERATED" not in t)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(_plain_line, min_size=1, max_size=4), min_size=1, max_size=5),
       st.lists(st.lists(_plain_line, max_size=3), min_size=4, max_size=4))
def test_fill_rewrites_only_the_blocks_and_is_idempotent(chunks, old_bodies):
    names = list(docs.BLOCKS)[:len(chunks) - 1]
    lines: list[str] = []
    for i, chunk in enumerate(chunks):
        lines += chunk
        if i < len(names):
            lines += [f"<!-- BEGIN GENERATED {names[i]} -->", *old_bodies[i], f"<!-- END GENERATED {names[i]} -->"]
    text = "\n".join(lines)
    bodies = {name: f"body of {name}\n| a | b |" for name in docs.BLOCKS}
    once = docs.fill(text, bodies, "doc.md")
    assert docs.fill(once, bodies, "doc.md") == once
    spans = docs.find_blocks(once, "doc.md")
    assert [s.name for s in spans] == names
    out = once.split("\n")
    for span in spans:
        assert out[span.begin] == docs.BLOCKS[span.name].begin_marker()
        assert "\n".join(out[span.begin + 1:span.end]) == bodies[span.name]
    # everything outside the blocks is the input's, in order
    outside = [line for i, line in enumerate(out) if not any(s.begin <= i <= s.end for s in spans)]
    assert outside == [line for chunk in chunks for line in chunk]


@pytest.mark.parametrize("text, message", [
    ("<!-- BEGIN GENERATED quickstart -->\nx", "doc.md:1: block 'quickstart' has no END marker"),
    ("x\n<!-- END GENERATED quickstart -->", "doc.md:2: END of block 'quickstart' without its BEGIN"),
    ("<!-- BEGIN GENERATED quickstart -->\n<!-- BEGIN GENERATED sensitivity -->",
     "doc.md:2: block 'sensitivity' begins inside block 'quickstart'"),
    ("<!-- BEGIN GENERATED -->", "doc.md:1: malformed generated-block marker"),
    ("<!-- BEGIN GENERATED nope -->\n<!-- END GENERATED nope -->", "doc.md:1: unknown generated block 'nope'"),
    (("<!-- BEGIN GENERATED quickstart -->\n<!-- END GENERATED quickstart -->\n"
     "<!-- BEGIN GENERATED quickstart -->\n<!-- END GENERATED quickstart -->"), "block 'quickstart' appears 2 times"),
])
def test_bad_markers_are_named_with_file_and_line(text, message):
    with pytest.raises(docs.DocsError, match=message.replace("(", r"\(")):
        docs.fill(text, {n: "" for n in docs.BLOCKS}, "doc.md")


def _checkout(tmp_path: Path, block: str) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(f"# t\n<!-- BEGIN GENERATED {block} -->\nold\n<!-- END GENERATED {block} -->\n")
    return tmp_path


def test_cli_names_a_missing_result_file_and_its_command(tmp_path, capsys):
    root = _checkout(tmp_path, "paper-table")
    assert docs.main(["--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "results/paper_table/paper_table.csv: missing" in err and "python studies/paper_table.py" in err
    assert "Traceback" not in err


def test_cli_check_fails_on_a_stale_block_then_passes_once_written(tmp_path, capsys):
    root = _checkout(tmp_path, "quickstart")
    (root / "results").mkdir()
    shutil.copy(ROOT / "results" / "quickstart.csv", root / "results" / "quickstart.csv")
    assert docs.main(["--root", str(root), "--check"]) == 1
    assert "+| ppo | `rllib-stock` |" in capsys.readouterr().out
    assert "old" in (root / "README.md").read_text()  # --check writes nothing
    assert docs.main(["--root", str(root)]) == 0
    assert docs.main(["--root", str(root), "--check"]) == 0


def test_cli_names_a_malformed_number(tmp_path, capsys):
    root = _checkout(tmp_path, "quickstart")
    (root / "results").mkdir()
    with (ROOT / "results" / "quickstart.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    rows[0]["iteration_time_s"] = "fast"
    with (root / "results" / "quickstart.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert docs.main(["--root", str(root)]) == 2
    assert "results/quickstart.csv: field 'iteration_time_s' is not a number: 'fast'" in capsys.readouterr().err


def test_paper_table_block_carries_the_files_figures_and_keeps_the_design_target_apart():
    text = docs.render_paper_table(ROOT)
    with (ROOT / docs.PAPER_CSV).open() as fh:
        rows = list(csv.DictReader(fh))
    table = [line for line in text.split("\n") if line.startswith("| ") and "algorithm" not in line]
    head = [r for r in rows if r["policy"] == docs.HEADLINE]
    assert len(table) == len(head)
    for r in head:
        change = docs._pct(float(r["iteration_reduction"]), float(r["iteration_reduction_ci95"]))
        mark = " †" if r["beyond_deployed"] == "True" else ""
        assert any(line.startswith(f"| {r['algorithm']} | {int(r['gpus']):,}{mark} | {change} |") for line in table)
    assert not any(docs.DESIGN_TARGET in line for line in table)
    if any(r["beyond_deployed"] == "True" for r in head):
        assert "refuses `num_learners > 1`" in text
    if any(r["policy"] == docs.DESIGN_TARGET for r in rows):
        assert "Design target, not deployed and never the headline" in text
