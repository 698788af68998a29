"""The measured figures in README.md and the user guide (docs/*.md), written from the results files.

A figure in a page is a marked span, two HTML comments around its text (GitHub shows the text alone):

    <!-- fig:f8k.temde.r1 -->22.18<!-- /fig -->

The key names an entry of FIGURES (figures_registry.py beside this file): a results file under
docs/research/results/, the path of the value inside it, and how it is shown. A span may also hold a block (the
README's results table), rendered from other entries. Hosts are figures too: `host.<file>` spans show the CPU and
cores the file records, so a timing and its machine change together.

    python scripts/figures.py            # exit 1 listing every span that differs from its file, and problems below
    python scripts/figures.py --write    # rewrite the spans from the files
    python scripts/figures.py --list     # every key with its value

Checked besides the spans (tests/scripts/test_figures.py runs the same checks):
- a results file that records the checkpoint it measured must name the served one (the fingerprint in
  models/checkpoints/default/config.json), unless OTHER_CHECKPOINT says why another is right for what it shows;
- a page may hold no measured figure outside a span (numbers with ms, images/s, GB, %, R@ ... outside code),
  except the phrases ALLOWED lists (settings and counts, not measurements);
- no README line is longer than README_MAX_LINE characters.
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path("docs/research/results")
SERVED_CONFIG = Path("models/checkpoints/default/config.json")
README_MAX_LINE = 300
WRITE_HINT = "python scripts/figures.py --write"

SPAN = re.compile(r"<!-- fig:(?P<key>[A-Za-z0-9_.@-]+) -->(?P<text>.*?)<!-- /fig -->", re.S)
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK_TARGET = re.compile(r"\]\([^)\s]*\)|<https?://[^>]*>")
# what reads as a measurement: a number with a unit of time, rate, size or share, or a recall
MEASURED = re.compile(
    r"\b\d[\d,]*(?:\.\d+)?\s?(?:ms|images/s|searches/s|images per second|searches per second|[KMG]i?B)\b"
    r"|\b\d+\.\d+\s?(?:s|x)\b|\b\d[\d,]*(?:\.\d+)?\s?%|R@\d+\D{0,12}\d+\.\d+")


class FigureError(Exception):
    """A key, file or path that does not resolve: the message says which."""


@dataclass(frozen=True)
class Fig:
    """One figure: the value(s) at `paths` in `file`, shown by `show`.

    file: under docs/research/results/, or a path from the repository root when it holds a "/".
    paths: "/"-separated keys inside the JSON ("t2i/TEMDE@100/R@1"); "{served}" stands for the served checkpoint's
    fingerprint, so a file keyed by checkpoint has no figure for the served one until it is measured.
    show: a format string applied to the values, or a function of them returning the text.
    """
    file: str
    paths: tuple[str, ...]
    show: str | Callable[..., str] = "{}"


@dataclass(frozen=True)
class Block:
    """A generated block (a table): render(value) returns its text, value(key) being another figure's text."""
    render: Callable[[Callable[[str], str]], str]


def num(file: str, path: str, fmt: str = "{:.2f}") -> Fig:
    return Fig(file, (path,), fmt)


def calc(file: str, paths: tuple[str, ...], fn: Callable[..., str]) -> Fig:
    return Fig(file, paths, fn)


def host(file: str, path: str = "machine") -> Fig:
    """`2-core Intel Xeon` from the file's machine record (a string such as "2 cores (Intel(R) Xeon(R) Processor),
    24 GiB RAM, ..." or {"cpu": ..., "cores": ...})."""
    return Fig(file, (path,), short_host)


def short_host(machine: Any) -> str:
    if isinstance(machine, dict):
        cores, cpu = machine.get("cores"), str(machine.get("cpu", ""))
    else:
        m = re.match(r"\s*(\d+) cores?\s*(?:\(([^()]*)\)|([^,]+))", re.sub(r"\((?:R|TM)\)", "", str(machine)))
        if not m:
            raise FigureError(f"cannot read cores and CPU from the machine record {machine!r}")
        cores, cpu = m.group(1), m.group(2) or m.group(3)
    cpu = re.sub(r"\((?:R|TM)\)|\b(?:Processor|CPU)\b", "", cpu)
    return f"{cores}-core {' '.join(cpu.split())}"


@dataclass
class Span:
    page: Path
    key: str
    text: str
    line: int


@dataclass
class Problem:
    page: str
    line: int
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.key}: {self.message}"


class Results:
    """The results files, read once each; value(key) renders a registry entry."""

    def __init__(self, root: Path = ROOT, figures: dict | None = None):
        self.root = root
        self.figures = figures if figures is not None else registry().FIGURES
        self._files: dict[str, Any] = {}

    @property
    def served(self) -> str:
        return self.load(str(SERVED_CONFIG))["fingerprint"]

    def path_of(self, file: str) -> Path:
        return self.root / (Path(file) if "/" in file else RESULTS / file)

    def load(self, file: str) -> Any:
        if file not in self._files:
            p = self.path_of(file)
            try:
                self._files[file] = json.loads(p.read_text())
            except (OSError, ValueError) as e:
                raise FigureError(f"cannot read {p.relative_to(self.root)}: {e}") from e
        return self._files[file]

    def lookup(self, file: str, path: str) -> Any:
        node = self.load(file)
        for part in path.replace("{served}", self.served).split("/"):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                raise FigureError(f"{file} has no {path!r} (no {part!r} there"
                                  + (f"; the served checkpoint is {self.served}" if "{served}" in path else "") + ")")
        return node

    def value(self, key: str) -> str:
        entry = self.figures.get(key)
        if entry is None:
            raise FigureError(f"no figure {key!r} in scripts/figures_registry.py")
        if isinstance(entry, Block):
            return "\n\n" + entry.render(self.value).strip("\n") + "\n\n"
        values = [self.lookup(entry.file, p) for p in entry.paths]
        return entry.show(*values) if callable(entry.show) else entry.show.format(*values)


@lru_cache(maxsize=1)
def registry():
    """scripts/figures_registry.py, imported once from its path (scripts/ is not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("figures_registry", Path(__file__).with_name("figures_registry.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("figures", sys.modules[__name__])
    spec.loader.exec_module(module)
    return module


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and the user guide (docs/*.md; not docs/research/, whose write-ups are records of their runs)."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def spans(page: Path) -> list[Span]:
    text = page.read_text()
    return [Span(page, m["key"], m["text"], text.count("\n", 0, m.start()) + 1) for m in SPAN.finditer(text)]


def _rel(page: Path, root: Path) -> str:
    return str(page.relative_to(root)) if page.is_relative_to(root) else str(page)


def check_spans(results: Results, page_list: list[Path] | None = None) -> list[Problem]:
    """Every span whose text is not what its file says (or whose key does not resolve)."""
    problems = []
    for page in page_list or pages(results.root):
        for s in spans(page):
            try:
                want = results.value(s.key)
            except FigureError as e:
                problems.append(Problem(_rel(page, results.root), s.line, s.key, str(e)))
                continue
            if s.text != want:
                if "\n" in want:
                    diff = "\n".join(difflib.unified_diff(s.text.strip("\n").splitlines(), want.strip("\n").splitlines(),
                                                          "page", "results", lineterm="", n=0))
                    msg = f"the block differs from its results files:\n{diff}"
                else:
                    msg = f"the page says {s.text!r}, {_source(results, s.key)} says {want!r}"
                problems.append(Problem(_rel(page, results.root), s.line, s.key, msg))
    return problems


def _source(results: Results, key: str) -> str:
    entry = results.figures[key]
    return f"{RESULTS / entry.file if '/' not in entry.file else entry.file}" if isinstance(entry, Fig) else "its block"


def write(results: Results, page_list: list[Path] | None = None) -> list[Path]:
    """Rewrite every span from its file; the pages changed."""
    changed = []
    for page in page_list or pages(results.root):
        text = page.read_text()
        new = SPAN.sub(lambda m: f"<!-- fig:{m['key']} -->{results.value(m['key'])}<!-- /fig -->", text)
        if new != text:
            page.write_text(new)
            changed.append(page)
    return changed


def recorded_checkpoint(data: Any) -> str | None:
    """The fingerprint a results file says it measured, where it says one."""
    if not isinstance(data, dict):
        return None
    for path in ("model_fingerprint", "fingerprints/default", "checkpoint/fingerprint", "checkpoint"):
        node: Any = data
        for part in path.split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, str) and re.fullmatch(r"[0-9a-f]{16}", node):
            return node
    return None


def checkpoint_problems(results: Results) -> list[str]:
    """Files behind the figures that record a checkpoint other than the served one, without a reason."""
    other = registry().OTHER_CHECKPOINT
    files = sorted({e.file for e in results.figures.values() if isinstance(e, Fig) and "/" not in e.file})
    out = []
    for f in files:
        fp = recorded_checkpoint(results.load(f))
        if fp and fp != results.served and f not in other:
            out.append(f"{RESULTS / f} records checkpoint {fp}, the served one is {results.served}: measure it again, "
                       f"or say in OTHER_CHECKPOINT why its figures hold for the served checkpoint")
    return out


def unbound(root: Path = ROOT, page_list: list[Path] | None = None) -> list[Problem]:
    """Measured-looking figures outside spans, code and links, not in ALLOWED."""
    allowed = registry().ALLOWED
    skip = registry().UNCHECKED_PAGES
    problems = []
    for page in page_list or pages(root):
        rel = _rel(page, root)
        if rel in skip:
            continue
        text = page.read_text()
        blanked = text
        for rx in (SPAN, FENCE, INLINE_CODE, LINK_TARGET):  # keep offsets: blank, do not cut
            blanked = rx.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), blanked)
        for m in MEASURED.finditer(blanked):
            line_no = blanked.count("\n", 0, m.start()) + 1
            line = text.splitlines()[line_no - 1]
            if any(a in line for a in allowed.get(rel, ())):
                continue
            problems.append(Problem(rel, line_no, m.group(0), "a measured figure outside a fig span"))
    return problems


def long_lines(root: Path = ROOT) -> list[Problem]:
    return [Problem("README.md", i, "line", f"{len(line)} characters, more than {README_MAX_LINE}")
            for i, line in enumerate((root / "README.md").read_text().splitlines(), 1) if len(line) > README_MAX_LINE]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite every span from its results file")
    mode.add_argument("--list", action="store_true", help="print every key with its value")
    args = ap.parse_args(argv)
    results = Results()
    if args.list:
        for key in sorted(results.figures):
            if isinstance(results.figures[key], Fig):
                print(f"{key:32} {results.value(key):24} {_source(results, key)}")
        return 0
    if args.write:
        for page in write(results):
            print(f"rewrote {page.relative_to(ROOT)}")
    problems = [str(p) for p in check_spans(results) + unbound() + long_lines()] + checkpoint_problems(results)
    for p in problems:
        print(p, file=sys.stderr)
    if problems and not args.write:
        print(f"\n{len(problems)} problem(s). A span that differs is fixed by `{WRITE_HINT}`; a figure outside a span "
              "is bound to its results file in scripts/figures_registry.py (or, a setting, listed in ALLOWED)",
              file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
