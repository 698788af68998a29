"""docs/configuration.md's settings tables, generated from every pydantic-settings class of the project.

    python scripts/settings_table.py           # print the generated block
    python scripts/settings_table.py --write   # replace the block between the markers in docs/configuration.md
    python scripts/settings_table.py --check   # exit 1 with a diff when docs/configuration.md is stale

The classes are found, not listed: every module under crossprobe.core, crossprobe.models, crossprobe.storage, crossprobe.indexer and
crossprobe.service whose source defines a class deriving from BaseSettings (or from a class named
*Settings, or from a Settings class found so far) is imported, and every BaseSettings subclass it
defines gets a table. Only those modules are imported (not torch, FAISS or ONNX Runtime ones).

Per field: the environment variable(s) exactly as pydantic-settings reads them (its own
EnvSettingsSource works them out: env_prefix + field name, validation aliases such as REDIS_URL,
and the prefixed name too when populate_by_name is on), the type with its bounds, the default as
one would write it in the environment, and the description: Field(description=...) when given,
else the comment on the field's line, else the comment block right above the field (pydantic
keeps no comments, so they are read from the class source).

tests/scripts/test_settings_table.py fails when docs/configuration.md differs from what this prints.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import enum
import importlib
import importlib.util
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretBytes, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DOC = ROOT / "docs" / "configuration.md"
PACKAGES = ("crossprobe.core", "crossprobe.models", "crossprobe.storage", "crossprobe.indexer", "crossprobe.service")
START = "<!-- settings-table:start -->"
END = "<!-- settings-table:end -->"
WRITE_HINT = "python scripts/settings_table.py --write"


# -- discovery ----------------------------------------------------------------------------------------------

def _package_modules(package: str) -> list[tuple[str, Path]]:
    """(module name, file) for every .py file under the package's folder, without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"settings_table: package {package} not found (is the project installed in this venv?)")
    out = []
    for base in map(Path, spec.submodule_search_locations):
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base)
            if any(p.startswith((".", "__pycache__")) for p in rel.parts):
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out.append((".".join([package, *parts]), path))
    return out


def _base_names(tree: ast.AST) -> set[str]:
    """Names of the bases of every class the module defines (`Settings`, `pydantic_settings.BaseSettings`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for b in node.bases:
                if isinstance(b, ast.Subscript):
                    b = b.value
                if isinstance(b, ast.Name):
                    names.add(b.id)
                elif isinstance(b, ast.Attribute):
                    names.add(b.attr)
    return names


def discover(packages: tuple[str, ...] = PACKAGES) -> list[type[BaseSettings]]:
    """Every BaseSettings subclass defined in the packages, sorted by module and name."""
    candidates = []
    for package in packages:
        for name, path in _package_modules(package):
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"))
            except SyntaxError as e:
                raise SystemExit(f"settings_table: cannot parse {path}: {e}") from e
            candidates.append((name, _base_names(tree)))
    known = {"BaseSettings"}
    imported: set[str] = set()
    found: dict[str, type[BaseSettings]] = {}
    while True:  # until no new module qualifies (a class deriving from a Settings class found in the last round)
        todo = [n for n, bases in candidates if n not in imported
                and any(b in known or b.endswith("Settings") for b in bases)]
        if not todo:
            break
        for name in todo:
            imported.add(name)
            module = importlib.import_module(name)  # an import error fails loudly: a table must not go missing
            for obj in vars(module).values():
                if (isinstance(obj, type) and issubclass(obj, BaseSettings) and obj is not BaseSettings
                        and obj.__module__ == module.__name__):
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
                    known.add(obj.__name__)
    return [found[k] for k in sorted(found)]


# -- one field ----------------------------------------------------------------------------------------------

def env_names(cls: type[BaseSettings], name: str) -> list[str]:
    """The environment variables pydantic-settings reads for a field, in its order of precedence."""
    field = cls.model_fields[name]
    try:
        from pydantic_settings import EnvSettingsSource

        source = EnvSettingsSource(cls)
        names = [env for _key, env, _complex in source._extract_field_info(field, name)]
    except Exception:  # another pydantic-settings version: its documented rules
        cfg = cls.model_config
        prefix = cfg.get("env_prefix", "")
        alias = field.validation_alias
        aliases = ([a if isinstance(a, str) else a.path[0] for a in alias.choices] if hasattr(alias, "choices")
                   else [alias.path[0]] if hasattr(alias, "path") else [alias] if alias else [])
        names = [str(a) for a in aliases]
        if not names or cfg.get("populate_by_name") or cfg.get("validate_by_name"):
            names.append(prefix + name)
    if not cls.model_config.get("case_sensitive", False):
        names = [n.upper() for n in names]
    return list(dict.fromkeys(names))  # REDIS_URL and redis_url are one variable when case-insensitive


_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path",
           SecretStr: "secret string", SecretBytes: "secret bytes"}


def type_text(annotation: Any) -> str:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is typing.Annotated:
        return type_text(args[0])
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return " or ".join(type_text(a) for a in rest)
    if origin is Literal:
        return "one of " + ", ".join(f"`{_env_value(a)}`" for a in args)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in annotation)
    if origin in (list, tuple, set, frozenset, dict) or annotation in (list, tuple, set, frozenset, dict):
        return f"JSON {getattr(origin or annotation, '__name__', 'value')}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "JSON object"
    if annotation in _SIMPLE:
        return _SIMPLE[annotation]
    return getattr(annotation, "__name__", str(annotation))


def bounds_text(field: FieldInfo) -> str:
    out = []
    for m in field.metadata:
        for attr, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"), ("min_length", "min length"),
                         ("max_length", "max length"), ("multiple_of", "multiple of")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{op} {_env_value(v)}")
        pattern = getattr(m, "pattern", None)
        if pattern is not None:
            out.append(f"matches `{pattern}`")
    return ", ".join(out)


def _env_value(v: Any) -> str:
    """A value as one writes it in the environment."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, enum.Enum):
        return _env_value(v.value)
    if isinstance(v, (SecretStr, SecretBytes)):
        return "********"
    if isinstance(v, BaseModel):
        return v.model_dump_json()
    if isinstance(v, (list, tuple, set, frozenset, dict)):
        return json.dumps(sorted(v) if isinstance(v, (set, frozenset)) else v, default=str)
    return str(v)


def default_value(field: FieldInfo, cls=None, name: str | None = None) -> str | None:
    """The default as an environment value; None when there is none to write (unset or required). A class with
    per-role defaults (StorageSettings.ROLE_DEFAULTS) has its own for some fields."""
    if name in getattr(cls, "ROLE_DEFAULTS", {}):
        value = cls.default_of(name)
    elif field.default_factory is not None:
        try:
            value = field.default_factory()
        except TypeError:  # a factory taking the validated data
            return None
    elif field.default is PydanticUndefined:
        return None
    else:
        value = field.default
    return None if value is None else _env_value(value)


def default_text(field: FieldInfo, cls=None, name: str | None = None) -> str:
    if field.is_required():
        return "**required**"
    value = default_value(field, cls, name)
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    return f"`{value}`"


# -- descriptions from the class source ----------------------------------------------------------------------

_SECTION = re.compile(r"^#\s*--")  # "# -- server ------": a group heading, not a field's description


def source_comments(cls: type) -> dict[str, str]:
    """{field: its comment} from the class source: the comment(s) on the field's own lines, else the
    full-line comments right above it (up to a blank line, code, or a `# --` group heading)."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = src.splitlines()
    comments: dict[int, str] = {}  # line (1-based) -> comment text
    own_line: set[int] = set()  # lines holding nothing but a comment
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            comments[row] = tok.string
            if not lines[row - 1][:col].strip():
                own_line.add(row)
    cls_node = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef))
    out = {}
    for node in cls_node.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        trailing = [comments[r] for r in range(node.lineno, node.end_lineno + 1)
                    if r in comments and r not in own_line]
        if trailing:
            text = trailing
        else:
            text, r = [], node.lineno - 1
            while r in own_line and not _SECTION.match(comments[r]):
                text.insert(0, comments[r])
                r -= 1
        cleaned = " ".join(t.lstrip("#").strip() for t in text).strip()
        if cleaned:
            out[node.target.id] = cleaned
    return out


def description(cls: type[BaseSettings], name: str) -> str:
    field = cls.model_fields[name]
    if field.description:
        return " ".join(field.description.split())
    for klass in cls.__mro__:  # the class that declares the field (a subclass may add fields, or re-declare)
        if not (isinstance(klass, type) and issubclass(klass, BaseSettings)) or klass is BaseSettings:
            continue
        if name in getattr(klass, "__annotations__", {}):
            return source_comments(klass).get(name, "")
    return ""


_TAG = re.compile(r"<[A-Za-z_/!?]")  # what markdown would take for the start of an HTML tag
_EDGE = re.compile(r"^([(\"']*)(.*?)([)\"'.,;:]*)$")


def _cell(text: str) -> str:
    """Table-cell safe: one line, pipes escaped, and a word like `<root>/redis.db` put in a code span
    (markdown would otherwise take `<root>` for an HTML tag and drop it)."""
    words, in_code = [], False
    for word in text.split():
        if not in_code and "`" not in word and _TAG.search(word):
            lead, core, trail = _EDGE.match(word).groups()
            word = f"{lead}`{core}`{trail}"
        in_code ^= word.count("`") % 2 == 1
        words.append(word)
    return " ".join(words).replace("|", "\\|")


# -- tables ---------------------------------------------------------------------------------------------------

def _docline(cls: type) -> str:
    doc = inspect.getdoc(cls) if cls.__doc__ else ""  # BaseSettings' own docstring is not this class's
    first = doc.strip().split("\n\n")[0] if doc else ""
    return " ".join(first.split())


def render_class(cls: type[BaseSettings]) -> str:
    cfg = cls.model_config
    prefix = cfg.get("env_prefix", "")
    env_file = cfg.get("env_file")
    files = [env_file] if isinstance(env_file, (str, Path)) else list(env_file or [])
    where = ("read from the environment, then " + ", ".join(f"`{f}`" for f in files) if files
             else "read from the environment only, no `.env` file")
    head = f"**`{cls.__module__}.{cls.__qualname__}`**"
    head += f" (env prefix `{prefix}`; {where})" if prefix else f" ({where})"
    doc = _docline(cls)
    if doc:
        head += f": {_cell(doc)}"
    rows = ["| variable | type | default | description |", "|---|---|---|---|"]
    for name, field in cls.model_fields.items():
        variables = ", ".join(f"`{n}`" for n in env_names(cls, name))
        kind = type_text(field.annotation)
        bounds = bounds_text(field)
        if bounds:
            kind += f", {bounds}"
        rows.append(f"| {variables} | {_cell(kind)} | {_cell(default_text(field, cls, name))} | {_cell(description(cls, name))} |")
    return head + "\n\n" + "\n".join(rows)


def render(classes: list[type[BaseSettings]] | None = None) -> str:
    classes = discover() if classes is None else classes
    return "\n\n".join(render_class(c) for c in classes)


# -- docs/configuration.md ---------------------------------------------------------------------------------------------------

def block(classes: list[type[BaseSettings]] | None = None) -> str:
    """What goes between the markers."""
    return f"{START}\n<!-- generated by `{WRITE_HINT}`: edit the Settings classes, not this -->\n\n" \
           f"{render(classes)}\n\n{END}"


def replace_block(text: str, new_block: str) -> str:
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"settings_table: no {START} ... {END} pair to replace (docs/configuration.md has one)")
    return text[:start] + new_block + text[end + len(END):]


def check(doc: Path = CONFIG_DOC, classes: list[type[BaseSettings]] | None = None) -> str:
    """'' when the document's block is current, else a unified diff (document -> generated)."""
    text = doc.read_text(encoding="utf-8")
    new = replace_block(text, block(classes))
    if new == text:
        return ""
    return "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                        f"{doc.name} (current)", f"{doc.name} (generated)"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="replace the block between the markers in --doc")
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff when --doc is stale")
    ap.add_argument("--doc", type=Path, default=CONFIG_DOC, help="default: docs/configuration.md")
    args = ap.parse_args(argv)
    if args.write:
        text = args.doc.read_text(encoding="utf-8")
        new = replace_block(text, block())
        if new != text:
            args.doc.write_text(new, encoding="utf-8")
        print(f"{args.doc}: configuration tables {'updated' if new != text else 'already current'}")
        return 0
    if args.check:
        diff = check(args.doc)
        if diff:
            sys.stdout.write(diff)
            print(f"\n{args.doc}: configuration tables are stale; run `{WRITE_HINT}`", file=sys.stderr)
            return 1
        return 0
    print(block())
    return 0


if __name__ == "__main__":
    sys.exit(main())
