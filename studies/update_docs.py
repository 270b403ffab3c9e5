"""The README's and docs' simulated figures, written from the studies' result files (issue 13).

No simulated figure in ``README.md`` or ``docs/*.md`` is typed by hand: each one sits in a
**generated block** that this script rewrites from a committed result file, so a figure cannot
outlive the run that produced it. A block is delimited by two HTML comments (invisible when the
markdown is rendered)::

    <!-- BEGIN GENERATED paper-table (python studies/update_docs.py; from results/paper_table/paper_table.csv) -->
    ...
    <!-- END GENERATED paper-table -->

and its body is :data:`BLOCKS`\\ ``[name]`` rendered from the files it names. Each rendering cites
the command that produced its source, so a reader can rerun it.

    python studies/update_docs.py            # rewrite every block from results/ (prints what changed)
    python studies/update_docs.py --check    # exit 1, with a diff, when a block differs from results/

``tests/test_docs_figures.py`` runs the check in the fast suite: regenerate a study's results and
you must rerun this script (and commit both) before the tests pass again.

Sources (each one command):

* ``quickstart`` -- ``results/quickstart.csv`` from ``make demo`` (``python studies/quickstart.py``);
* ``paper-table`` -- ``results/paper_table/paper_table.csv`` from ``python studies/paper_table.py``
  (or a ``--merge`` of runs made apart);
* ``sensitivity`` -- ``results/sensitivity/sensitivity.csv`` from ``python studies/sensitivity.py``.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import math
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the files whose generated blocks this script owns
DOC_GLOBS = ("README.md", "docs/*.md")
#: the policies the quickstart and the paper table compare against
BASELINE = "rllib-stock"
HEADLINE = "conduit"
DESIGN_TARGET = "conduit-target"
#: an iteration less than this much lower than stock counts as "does not help" (the studies' own rule)
NO_HELP = 0.05
#: the published figures, at 1,024 GPUs (exposed latency, iteration time)
PUBLISHED = {"exposed_reduction": 0.97, "iteration_reduction": 0.38}
#: the order algorithms are listed in
ALGORITHM_ORDER = ("ppo", "appo", "dqn", "grpo")

_BEGIN = re.compile(r"^<!-- BEGIN GENERATED (?P<name>[a-z0-9-]+)(?: \((?P<note>[^)]*)\))? -->$")
_END = re.compile(r"^<!-- END GENERATED (?P<name>[a-z0-9-]+) -->$")


class DocsError(Exception):
    """A result file is missing or malformed, or a document's markers do not pair up."""


@dataclass(frozen=True)
class Block:
    """One generated block: the result files it is written from and how."""

    name: str
    sources: tuple[str, ...]
    command: str
    render: Callable[[Path], str]

    def begin_marker(self) -> str:
        return (f"<!-- BEGIN GENERATED {self.name} (python studies/update_docs.py; from "
                f"{', '.join(self.sources)}) -->")


# ---------------------------------------------------------------------------------------- reading
def read_csv(root: Path, relative: str, command: str, columns: Iterable[str]) -> list[dict[str, str]]:
    """The rows of ``root/relative``; a missing file or column is a :class:`DocsError` naming the
    file and the command that writes it."""
    path = root / relative
    if not path.is_file():
        raise DocsError(f"{relative}: missing; `{command}` writes it")
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise DocsError(f"{relative}: no column(s) {', '.join(missing)}; rerun `{command}`")
    if not rows:
        raise DocsError(f"{relative}: no rows; rerun `{command}`")
    return rows


def _float(row: dict[str, str], key: str, where: str) -> float:
    try:
        return float(row[key])
    except (TypeError, ValueError):
        raise DocsError(f"{where}: field {key!r} is not a number: {row.get(key)!r}") from None


def _order(algorithm: str) -> int:
    return ALGORITHM_ORDER.index(algorithm) if algorithm in ALGORITHM_ORDER else len(ALGORITHM_ORDER)


def _pct(x: float, ci: float | None = None) -> str:
    """A reduction as a signed change (a reduction is negative, as published), with its CI."""
    if math.isnan(x):
        return "n/a"
    text = f"{-100 * x:+.1f}%"
    if ci is not None and not math.isnan(ci):
        text += f" ± {100 * ci:.1f}"
    return text


def _change(row: dict[str, str], key: str) -> str:
    """``row[key]`` (a reduction) with its 95% interval, as :func:`_pct` writes it."""
    return _pct(_float(row, key, PAPER_CSV), _float(row, key + "_ci95", PAPER_CSV))


# -------------------------------------------------------------------------------------- quickstart
QUICKSTART_CSV = "results/quickstart.csv"
QUICKSTART_COMMAND = "make demo"


def render_quickstart(root: Path) -> str:
    """The quickstart table (every workload x policy, ratios to the first policy of each workload)
    and, per workload, whether the deployed Conduit helps."""
    rows = read_csv(root, QUICKSTART_CSV, QUICKSTART_COMMAND,
                    ("topology", "workload", "policy", "exposed_experience_path_s", "iteration_time_s",
                     "exposed_vs_first", "iteration_vs_first", "violations"))
    where = QUICKSTART_CSV
    topology = rows[0]["topology"]
    out = [(f"Simulated on `{topology}`, seed 0 (`{QUICKSTART_COMMAND}`, i.e. `python studies/quickstart.py`, "
           f"writes `{QUICKSTART_CSV}`); ratios to `{rows[0]['policy']}`:"), "",
           "| workload | policy | exposed path | vs stock | iteration | vs stock |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['workload']} | `{r['policy']}` | {1e3 * _float(r, 'exposed_experience_path_s', where):.2f} ms | "
                   f"{_float(r, 'exposed_vs_first', where):.3f}x | {1e3 * _float(r, 'iteration_time_s', where):.1f} ms | "
                   f"{_float(r, 'iteration_vs_first', where):.3f}x |")
    by = {(r["workload"], r["policy"]): r for r in rows}
    out += ["", (f"Where the deployed Conduit (`{HEADLINE}`) does and does not help (iteration less than "
            f"{100 * NO_HELP:.0f}% lower than stock: no help):"), ""]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        ours, base = by.get((workload, HEADLINE)), by.get((workload, BASELINE))
        if ours is None or base is None:
            continue
        ratio = _float(ours, "iteration_time_s", where) / _float(base, "iteration_time_s", where)
        verdict = ("**does not help**" if ratio > 1 - NO_HELP else "helps") + f": iteration {ratio:.3f}x stock"
        if ratio > 1:
            verdict += " (slower)"
        target = by.get((workload, DESIGN_TARGET))
        extra = (f"; the design target `{DESIGN_TARGET}` (not deployed) would reach "
                 f"{_float(target, 'iteration_time_s', where) / _float(base, 'iteration_time_s', where):.3f}x"
                 if target is not None else "")
        out.append(f"- {workload}: {verdict}{extra}")
    violations = sum(int(_float(r, "violations", where)) for r in rows)
    out += ["", f"Audit violations over all {len(rows)} runs: {violations}."]
    return "\n".join(out)


# ------------------------------------------------------------------------------------- paper table
PAPER_CSV = "results/paper_table/paper_table.csv"
PAPER_COMMAND = "python studies/paper_table.py"
_PAPER_COLUMNS = ("algorithm", "gpus", "policy", "label", "seeds", "stock_share", "iteration_reduction",
                  "iteration_reduction_ci95", "exposed_reduction", "exposed_reduction_ci95", "violations",
                  "beyond_deployed", "not_steady")


def render_paper_table(root: Path) -> str:
    """The paper table's headline rows (``conduit`` against ``rllib-stock``), which of them
    extrapolate beyond the deployed runtime, the published figures beside them, and the design
    target on its own line, never in the headline table."""
    rows = read_csv(root, PAPER_CSV, PAPER_COMMAND, _PAPER_COLUMNS)
    where = PAPER_CSV
    for r in rows:
        r["_gpus"] = int(_float(r, "gpus", where))
    head = sorted((r for r in rows if r["policy"] == HEADLINE),
                  key=lambda r: (_order(r["algorithm"]), r["_gpus"]))
    if not head:
        raise DocsError(f"{where}: no `{HEADLINE}` rows; rerun `{PAPER_COMMAND}`")
    seeds = sorted({int(_float(r, "seeds", where)) for r in head})
    out = [(f"`{HEADLINE}` (Conduit as `enable()` deploys it) against `{BASELINE}` (stock RLlib 2.60 as its code "
           f"runs), simulated; change of the mean over seeds of the per-seed ratio, ± the 95% interval's "
           f"half-width ({seeds[0] if len(seeds) == 1 else f'{seeds[0]} to {seeds[-1]}'} "
           f"seed(s) per cell, column *seeds*; `{PAPER_COMMAND}` writes "
           f"`{PAPER_CSV}`; the full report is `results/paper_table/paper_table.md`):"), "",
           "| algorithm | GPUs | iteration change | exposed-latency change | stock experience share | seeds |",
           "|---|---:|---|---|---:|---:|"]
    scales = sorted({r["_gpus"] for r in head})
    missing = [f"{a} at {g:,} GPUs" for a in sorted({r["algorithm"] for r in head}, key=_order) for g in scales
               if not any(r["algorithm"] == a and r["_gpus"] == g for r in head)]
    beyond = []
    for r in head:
        mark = ""
        if r["beyond_deployed"].strip().lower() in ("true", "1"):
            mark = " †"
            beyond.append(f"{r['algorithm']} at {r['_gpus']:,}")
        out.append(f"| {r['algorithm']} | {r['_gpus']:,}{mark} | "
                   f"{_pct(_float(r, 'iteration_reduction', where), _float(r, 'iteration_reduction_ci95', where))} | "
                   f"{_pct(_float(r, 'exposed_reduction', where), _float(r, 'exposed_reduction_ci95', where))} | "
                   f"{100 * _float(r, 'stock_share', where):.1f}% | {int(_float(r, 'seeds', where))} |")
    out.append("")
    if missing:
        out += [f"Not in this table (not run, or stopped before the pair finished): {', '.join(missing)}.", ""]
    if beyond:
        out.append("† More than one learner: `enable()` refuses `num_learners > 1` today, so these rows apply the "
                   "deployed mechanisms per learner, an extrapolation beyond the deployed runtime (each run "
                   "carries the validity warning): " + ", ".join(beyond) + " GPUs.")
        out.append("")
    top = max(r["_gpus"] for r in head)
    best_it = max(head, key=lambda r: _float(r, "iteration_reduction", where))
    best_ex = max(head, key=lambda r: _float(r, "exposed_reduction", where))
    out.append(f"Published (1,024 GPUs): exposed latency {_pct(PUBLISHED['exposed_reduction'])}, iteration "
               f"{_pct(PUBLISHED['iteration_reduction'])}. Largest simulated reductions here: exposed "
               f"{_pct(_float(best_ex, 'exposed_reduction', where))} ({best_ex['algorithm']}, {best_ex['_gpus']:,} GPUs), "
               f"iteration {_pct(_float(best_it, 'iteration_reduction', where))} ({best_it['algorithm']}, "
               f"{best_it['_gpus']:,} GPUs); largest scale run: {top:,} GPUs.")
    weak = [r for r in head if _float(r, "iteration_reduction", where) < NO_HELP]
    if weak:
        out += ["", f"**Where Conduit does not help** (iteration less than {100 * NO_HELP:.0f}% lower; positive: "
                "slower than stock): "
                + ", ".join(f"{r['algorithm']} at {r['_gpus']:,} GPUs "
                            f"({_pct(_float(r, 'iteration_reduction', where))})" for r in weak) + "."]
    unsure = [r for r in head if r not in weak and not math.isnan(_float(r, "iteration_reduction_ci95", where))
              and _float(r, "iteration_reduction", where) - _float(r, "iteration_reduction_ci95", where) < NO_HELP]
    if unsure:
        out += ["", "Not distinguishable from no help (the 95% interval reaches below a "
                f"{100 * NO_HELP:.0f}% gain): "
                + ", ".join(f"{r['algorithm']} at {r['_gpus']:,} GPUs ({_change(r, 'iteration_reduction')})"
                            for r in unsure) + "."]
    dominated = [r for r in head if _float(r, "stock_share", where) > 0.9]
    if dominated:
        out += ["", "Stock experience share above 90% (the reduction rests on the stock model's costs at a scale no "
                "measurement confirms): " + ", ".join(f"{r['algorithm']} at {r['_gpus']:,} GPUs" for r in dominated) + "."]
    unsteady = [r for r in head if _float(r, "not_steady", where) > 0]
    if unsteady:
        out += ["", "Not in steady state after the run was doubled three times (the mean depends on the run's "
                "length): " + ", ".join(f"{r['algorithm']} at {r['_gpus']:,} GPUs" for r in unsteady) + "."]
    target = sorted((r for r in rows if r["policy"] == DESIGN_TARGET), key=lambda r: (_order(r["algorithm"]), r["_gpus"]))
    if target:
        out += ["", f"Design target, not deployed and never the headline (`{DESIGN_TARGET}`: no driver loop, free "
                "plane calls, batches in HBM), iteration change against the same stock runs: "
                + ", ".join(f"{r['algorithm']} {r['_gpus']:,} GPUs {_pct(_float(r, 'iteration_reduction', where))}"
                            for r in target) + "."]
    violations = sum(int(_float(r, "violations", where)) for r in rows)
    out += ["", f"Audit violations, all runs: {violations}."]
    return "\n".join(out)


# ------------------------------------------------------------------------------------- sensitivity
SENSITIVITY_CSV = "results/sensitivity/sensitivity.csv"
SENSITIVITY_COMMAND = "python studies/sensitivity.py"


def render_sensitivity(root: Path) -> str:
    """Per algorithm: the range of the conduit/stock iteration ratio over the sweep, and plainly how
    many cells gain less than :data:`NO_HELP`."""
    rows = read_csv(root, SENSITIVITY_CSV, SENSITIVITY_COMMAND,
                    ("algorithm", "plane", "x_name", "x", "y_name", "y", "gpus", "iteration_ratio", "violations"))
    where = SENSITIVITY_CSV
    scales = sorted({int(_float(r, "gpus", where)) for r in rows})
    out = [(f"Conduit / stock iteration-time ratio over the sensitivity sweep (actor/learner ratio x observation "
           f"bytes on 8 GPUs; scale ({', '.join(f'{s:,}' for s in scales)} GPUs) x the stock model's RPC and "
           f"serialisation costs), simulated, one seed (`{SENSITIVITY_COMMAND}` writes `{SENSITIVITY_CSV}`; "
           "heatmaps and the full list in `results/sensitivity/`):"), "",
           "| algorithm | cells | best ratio | worst ratio | cells with < 5% gain |", "|---|---:|---:|---:|---:|"]
    algorithms = sorted({r["algorithm"] for r in rows}, key=_order)
    notes = []
    for algorithm in algorithms:
        cells = [r for r in rows if r["algorithm"] == algorithm]
        ratios = [_float(r, "iteration_ratio", where) for r in cells]
        weak = [r for r, v in zip(cells, ratios, strict=True) if v > 1 - NO_HELP]
        out.append(f"| {algorithm} | {len(cells)} | {min(ratios):.3f} | {max(ratios):.3f} | {len(weak)} |")
        if len(weak) == len(cells):
            notes.append(f"- **{algorithm}: nowhere** in this sweep (ratio {min(ratios):.3f} to {max(ratios):.3f}).")
        elif weak:
            planes = sorted({r["plane"] for r in weak})
            notes.append(f"- **{algorithm}**: no help in {len(weak)} of {len(cells)} cells "
                         f"({', '.join(planes)}).")
    out += ["", "Where Conduit does not help:", "", *(notes or ["- it gains at least 5% in every cell"])]
    ratios = [_float(r, "iteration_ratio", where) for r in rows]
    slower = [r for r, v in zip(rows, ratios, strict=True) if v > 1]
    if slower:
        worst = max(slower, key=lambda r: _float(r, "iteration_ratio", where))
        out += ["", (f"Slower than stock (ratio above 1) in {len(slower)} of {len(rows)} cells; the worst, "
                f"{_float(worst, 'iteration_ratio', where):.2f}x, is {worst['algorithm']} with {worst['x_name']}="
                f"{worst['x']} and {worst['y_name']}={worst['y']} ({worst['plane']}).")]
    if "not_steady" in rows[0]:
        unsteady = [r for r in rows if _float(r, "not_steady", where) > 0]
        if unsteady:
            out += ["", "Not in steady state after the run was doubled three times (read as a trend): "
                    + "; ".join(f"{r['algorithm']} {r['plane']} {r['x_name']}={r['x']}, {r['y_name']}={r['y']}"
                                for r in unsteady) + "."]
    violations = sum(int(_float(r, "violations", where)) for r in rows)
    out += ["", f"Audit violations, all cells: {violations}."]
    return "\n".join(out)


BLOCKS: dict[str, Block] = {b.name: b for b in (
    Block("quickstart", (QUICKSTART_CSV,), QUICKSTART_COMMAND, render_quickstart),
    Block("paper-table", (PAPER_CSV,), PAPER_COMMAND, render_paper_table),
    Block("sensitivity", (SENSITIVITY_CSV,), SENSITIVITY_COMMAND, render_sensitivity),
)}


# ----------------------------------------------------------------------------------- the documents
@dataclass(frozen=True)
class Span:
    """One generated block found in a document: its name and the line numbers of its markers."""

    name: str
    begin: int
    end: int


def find_blocks(text: str, where: str) -> list[Span]:
    """The generated blocks of ``text`` (markers alone on their lines); unpaired, nested or
    repeated markers are a :class:`DocsError` naming ``where`` and the line."""
    spans: list[Span] = []
    open_name, open_line = None, -1
    for i, line in enumerate(text.split("\n")):
        begin, end = _BEGIN.match(line.strip()), _END.match(line.strip())
        if begin:
            if open_name is not None:
                raise DocsError(f"{where}:{i + 1}: block {begin['name']!r} begins inside block {open_name!r}")
            open_name, open_line = begin["name"], i
        elif end:
            if open_name != end["name"]:
                raise DocsError(f"{where}:{i + 1}: END of block {end['name']!r} without its BEGIN")
            spans.append(Span(open_name, open_line, i))
            open_name = None
        elif "GENERATED" in line and line.lstrip().startswith("<!--"):
            raise DocsError(f"{where}:{i + 1}: malformed generated-block marker: {line.strip()!r}")
    if open_name is not None:
        raise DocsError(f"{where}:{open_line + 1}: block {open_name!r} has no END marker")
    names = [s.name for s in spans]
    for name in names:
        if names.count(name) > 1:
            raise DocsError(f"{where}: block {name!r} appears {names.count(name)} times")
    return spans


def fill(text: str, bodies: dict[str, str], where: str) -> str:
    """``text`` with the body of every generated block replaced by ``bodies[name]`` (and its BEGIN
    marker rewritten to the canonical one); a block name without a body is a :class:`DocsError`."""
    lines = text.split("\n")
    out: list[str] = []
    last = 0
    for span in find_blocks(text, where):
        if span.name not in bodies:
            raise DocsError(f"{where}:{span.begin + 1}: unknown generated block {span.name!r} "
                            f"(known: {', '.join(sorted(bodies))})")
        begin = BLOCKS[span.name].begin_marker() if span.name in BLOCKS else lines[span.begin]
        out += lines[last:span.begin] + [begin, bodies[span.name], lines[span.end]]
        last = span.end + 1
    out += lines[last:]
    return "\n".join(out)


def documents(root: Path) -> list[Path]:
    return [p for pattern in DOC_GLOBS for p in sorted(root.glob(pattern))]


def render_all(root: Path, names: Iterable[str]) -> dict[str, str]:
    return {name: BLOCKS[name].render(root) for name in names}


def update(root: Path = ROOT, write: bool = True) -> dict[Path, tuple[str, str]]:
    """Every document whose generated blocks differ from what the result files say, as
    ``{path: (old, new)}``; with ``write`` the new text is written."""
    texts = {p: p.read_text() for p in documents(root)}
    used = sorted({s.name for p, t in texts.items() for s in find_blocks(t, str(p.relative_to(root)))
                   if s.name in BLOCKS})
    bodies = render_all(root, used)
    changed = {}
    for path, old in texts.items():
        new = fill(old, bodies, str(path.relative_to(root)))
        if new != old:
            changed[path] = (old, new)
            if write:
                path.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 with a diff when a block differs from the result files")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this script's)")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        print(f"update_docs: --root {args.root}: not a directory", file=sys.stderr)
        return 2
    try:
        changed = update(args.root, write=not args.check)
    except DocsError as exc:
        print(f"update_docs: {exc}", file=sys.stderr)
        return 2
    for path, (old, new) in changed.items():
        rel = str(path.relative_to(args.root))
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), rel, rel + " (from results)"))
        else:
            print(f"rewrote the generated blocks of {rel}")
    if args.check and changed:
        print(f"\n{len(changed)} document(s) differ from the result files: run `python studies/update_docs.py`",
              file=sys.stderr)
        return 1
    if not changed:
        print("every generated block matches the result files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
