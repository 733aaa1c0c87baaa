"""The house rules that a file layout can break: every maintainer tool is named in
results/README.md and imports what exists; every record under results/ has its row in
results/README.md (what, command, GPU, date, code); the tree stays small; no history
narrative in the product's prose."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INDEX = (ROOT / "results" / "README.md").read_text()
TOOLS = sorted(p for p in (ROOT / "tools").iterdir() if p.is_file())
HISTORY = re.compile(
    r"\b(first|second|third|[a-z-]*(fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh"
    r"|twelfth|teenth|tieth)|this|last|next|earlier|previous|later) sessions?\b"
    r"|\bsessions?'s\b|\brun [0-9]+\b|\bruns [0-9]+(-| to | and )[0-9]+", re.IGNORECASE)


# How a thing came to be, in the documents that say what the software does and why.
NARRATIVE = re.compile(
    r"\b(first|earlier|previous|old|initial) (version|form|kernel|template)s?\b"
    r"|\bbefore (the|its|this|that) [\w-]+( [\w-]+)? (was|were|had been)\b"
    r"|\bnot yet (explained|understood|known)\b"
    r"|\b(got|became|grew|came out) [0-9.]+ ?% (faster|slower)\b|\bsince removed\b"
    r"|\bused to\b|\bwe (tried|found|added|changed)\b|\ba regression\b",
    re.IGNORECASE)
NARRATIVE_FREE = ("README.md", "docs/design.md", "docs/nn.md", "docs/bad-input.md")


@pytest.mark.parametrize("doc", NARRATIVE_FREE)
def test_the_documents_say_what_and_why_not_how_it_came_to_be(doc):
    found = [m.group(0) for m in NARRATIVE.finditer((ROOT / doc).read_text())]
    assert not found, f"{doc}: history narrative {found}"


def test_the_narrative_check_catches_history():
    for text in ("the first version ran 0.34x", "before the MMAs were issued ahead of the "
                 "copies", "a regression not yet explained", "every run got 14 % faster"):
        assert NARRATIVE.search(text), text
    assert not NARRATIVE.search("the kernel copies A first, then runs the MMAs")


def test_tools_are_few_and_each_is_named_in_the_results_index():
    assert len(TOOLS) <= 15
    tools = INDEX.split("## Maintainer tools", 1)[-1]
    unnamed = [p.name for p in TOOLS if f"`tools/{p.name}`" not in tools]
    assert not unnamed, f"tools results/README.md's tools table does not name: {unnamed}"


@pytest.mark.parametrize("tool", [p for p in TOOLS if p.suffix == ".py"], ids=lambda p: p.name)
def test_tool_imports_what_the_package_has(tool):
    """A tool's imports of nmgen name modules and attributes that exist (the tools run
    on the GPU machine only; this keeps them in step with the package)."""
    for node in ast.walk(ast.parse(tool.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nmgen"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}"), f"{tool.name}: {node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("nmgen"):
                    importlib.import_module(alias.name)


def index_rows() -> dict[str, str]:
    """Each entry results/README.md's index names in a row's first cell, with its row."""
    table = INDEX.split("## Index", 1)[-1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) >= 6:
            for entry in re.findall(r"`([^`]+)`", cells[0]):
                rows[entry] = line
    return rows


def records() -> list[str]:
    """Every folder under results/ (as ``path/``) and every file at its top."""
    base = ROOT / "results"
    folders = [p.relative_to(base).as_posix() + "/" for p in base.rglob("*") if p.is_dir()]
    files = [p.name for p in base.iterdir() if p.is_file() and p.name != "README.md"]
    return sorted(folders + files)


def test_every_record_has_its_row_in_the_results_index():
    """Every record says what it shows, the command that made it, its GPU, its date and
    its code; no row names a record that is gone."""
    rows = index_rows()
    missing = [entry for entry in records() if entry not in rows]
    assert not missing, f"results/README.md's index has no row for: {missing}"
    gone = [entry for entry in rows if not (ROOT / "results" / entry).exists()]
    assert not gone, f"results/README.md's index names records that do not exist: {gone}"
    for entry, row in rows.items():
        what, command, gpu, date, code = (c.strip() for c in row.split(" | ")[1:6])
        assert what and command, f"{entry}: what it shows and its command"
        assert re.search(r"\b(H100|H200|CPU)\b", gpu), f"{entry}: GPU {gpu!r}"
        assert re.fullmatch(r"2\d{3}-\d\d-\d\d(, 2\d{3}-\d\d-\d\d)*", date), \
            f"{entry}: date {date!r}"
        assert re.search(r"\b[0-9a-f]{7}\b", code), f"{entry}: code {code!r}"


def test_the_tree_is_small():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    size = sum((ROOT / f).stat().st_size for f in files
               if (ROOT / f).exists() and not f.endswith((".sqlite", ".db")))
    assert size <= 8 * 2**20, f"tracked tree {size / 2**20:.1f} MB without the databases"


def test_no_history_narrative_in_the_product():
    prose = [ROOT / "README.md", *ROOT.glob("nmgen/**/*.py"), *ROOT.glob("nmgen/**/*.j2"),
             *TOOLS, *ROOT.glob("tests/**/*.py")]
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in prose
             for m in HISTORY.finditer(p.read_text()) if p.name != "test_house.py"]
    assert not found, found
