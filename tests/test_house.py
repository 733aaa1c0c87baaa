"""The house rules that a file layout can break: every maintainer tool is named in the
README and imports what exists; every record under results/ is cited by the README or a
test; the tree stays small; no history narrative in the product's prose."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
TOOLS = sorted(p for p in (ROOT / "tools").iterdir() if p.is_file())
HISTORY = re.compile(
    r"\b(first|second|third|[a-z-]*(fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh"
    r"|twelfth|teenth|tieth)|this|last|next|earlier|previous|later) sessions?\b"
    r"|\bsessions?'s\b|\brun [0-9]+\b|\bruns [0-9]+(-| to | and )[0-9]+", re.IGNORECASE)


def test_tools_are_few_and_each_is_named_in_the_readme():
    assert len(TOOLS) <= 15
    unnamed = [p.name for p in TOOLS if f"tools/{p.name}" not in README]
    assert not unnamed, f"tools the README does not name: {unnamed}"


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


def test_every_record_is_cited_by_the_readme_or_a_test():
    tests = "".join(p.read_text() for p in (ROOT / "tests").glob("*.py"))
    index = (ROOT / "results" / "README.md").read_text()
    for entry in sorted((ROOT / "results").iterdir()):
        if entry.name == "README.md":
            continue
        cited = (f"results/{entry.name}" in README + tests
                 or f'"results" / "{entry.name}"' in tests)
        assert cited, f"results/{entry.name} is cited neither by README.md nor by a test"
        assert f"`{entry.name}" in index, f"results/README.md does not say how {entry.name} " \
            "was made"


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
