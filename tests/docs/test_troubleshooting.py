"""docs/troubleshooting.md quotes the messages users meet as the code prints them: each line of its ```message
blocks must still be a string the package (core/, models/, indexer/, service/, cli/) writes, so the page cannot go stale.

How a quoted line is matched: `<...>` (with the quotes around it, if any: '<name>') stands for what varies
(a name, a number, the text of another error), `...` for text left out. What is left, the literal parts, must
appear in that order inside ONE string literal of the package: an f-string's {fields} match anything, and
literals split over lines ("a " "b") count as the one string Python makes of them. A line with little fixed text
(under MIN_LITERAL characters) must be a whole string of the source. A line starting with
"error: " is a command's failure as the command line prints it (cli/): that prefix
must be the CLI's, and the rest the message.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
PACKAGES = ("core", "models", "storage", "indexer", "service", "cli")
BLOCK = re.compile(r"^```message\n(.*?)^```", re.S | re.M)
HOLE = re.compile(r"'?<[^<>\n]+>'?|\.\.\.")  # a placeholder, quoted or not, or text left out
FIELD = "\x00"  # an f-string's {field} in the source's text
CLI_PREFIX = "error: "
MIN_LITERAL = 16  # a shorter quoted line ("warming up") must be a whole string of the source, not a part


def _text(node: ast.AST) -> str | None:
    """A string expression's text with each formatted field as FIELD; None if it is not one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else FIELD for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # "a" + f"b": one message in two pieces
        left, right = _text(node.left), _text(node.right)
        if left is not None or right is not None:
            return (left if left is not None else FIELD) + (right if right is not None else FIELD)
    return None


def _literals() -> list[str]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                text = _text(node)
                if text is not None and len(text) >= 8:
                    out.append(text)
    return out


def quoted_lines(page: str) -> list[str]:
    return [line.strip() for block in BLOCK.findall(page) for line in block.splitlines() if line.strip()]


def pattern(line: str) -> tuple[re.Pattern, int]:
    """The quoted line as a regex over a source literal -> (it, how many literal characters it holds)."""
    parts = HOLE.split(line)
    literal = sum(len(p) for p in parts)
    # a FIELD in the source may stand where the page writes a value; the page's holes match anything
    rx = ".*?".join(re.escape(p) for p in parts)
    return re.compile(rx, re.S), literal


def found(line: str, literals: list[str]) -> bool:
    rx, size = pattern(line)
    match = rx.search if size >= MIN_LITERAL else rx.fullmatch
    return any(match(text) for text in literals)


@pytest.fixture(scope="module")
def literals() -> list[str]:
    return _literals()


def test_the_page_quotes_messages():
    lines = quoted_lines(PAGE.read_text())
    assert len(lines) >= 25, "docs/troubleshooting.md should quote the messages it explains in ```message blocks"


def test_every_quoted_message_is_in_the_source(literals):
    missing = []
    for line in quoted_lines(PAGE.read_text()):
        body = line[len(CLI_PREFIX):] if line.startswith(CLI_PREFIX) else line
        if not found(body, literals):
            missing.append(line)
    assert not missing, ("docs/troubleshooting.md quotes messages no string of models/, indexer/, service/ "
                         "prints any more; quote them as the code now writes them:\n" + "\n".join(missing))


def test_the_cli_prefix_is_the_clis(literals):
    assert any(t == CLI_PREFIX + FIELD for t in literals)


def test_the_check_fails_on_a_reworded_message(literals):
    """The matcher is not vacuous: a real message passes, the same with one word changed does not."""
    real = "is being built by another process"
    assert found(f"<name>/<version> {real}", literals)
    assert not found(f"<name>/<version> {real.replace('another', 'a second')}", literals)
    assert not found("no index '<name>' here; served by <names>", literals)
    assert found("no index '<name>' here; served: <names>", literals)
    assert found("warming up", literals) and not found("warming", literals)  # short: the whole string only
