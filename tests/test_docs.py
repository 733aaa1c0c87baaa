"""The documents hold their shape: README.md is the user's door (short, two two-command
blocks, a plot, figures that come from the records it cites), docs/design.md has every
section the code cites, docs/engineering-notes.md is one sitting and has every section
the code cites. No GPU."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DESIGN = (ROOT / "docs" / "design.md").read_text()
NOTES = (ROOT / "docs" / "engineering-notes.md").read_text()
README_MAX_LINES = 250
NOTES_MAX_LINES = 400
# A cited path under results/: letters, digits and the punctuation record names use.
RESULTS_PATH = re.compile(r"\bresults/[A-Za-z0-9_./-]*[A-Za-z0-9_/]")


def code_text() -> list[tuple[str, str]]:
    """(path, text) of every module and template of the package, of the tools and of the
    shape lists (which cite the design for where their shapes come from)."""
    files = [*ROOT.glob("nmgen/**/*.py"), *ROOT.glob("nmgen/**/*.j2"),
             *(p for p in (ROOT / "tools").iterdir() if p.is_file()),
             *ROOT.glob("shapes/*.txt")]
    return [(p.relative_to(ROOT).as_posix(), p.read_text()) for p in sorted(files)]


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of a Markdown text, up to the next ``## ``."""
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no '## {heading}' section"
    return match.group(1)


def fenced_blocks(text: str) -> list[list[str]]:
    """The lines of each fenced code block, in order."""
    return [block.strip("\n").splitlines()
            for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S)]


def numbered_sections(text: str) -> set[int]:
    return {int(n) for n in re.findall(r"^## (\d+)\. ", text, re.M)}


def cited_sections(document: str) -> list[tuple[str, int]]:
    """(file, section) of every ``DOCUMENT §N`` (or ``§N-M``) citation in the code."""
    pattern = re.compile(rf"{re.escape(document)}\s+§(\d+)(?:\s*-\s*(\d+))?")
    out = []
    for path, text in code_text():
        for match in pattern.finditer(text):
            first = int(match.group(1))
            last = int(match.group(2) or first)
            out += [(path, n) for n in range(first, last + 1)]
    return out


# ------------------------------------------------------------------ README.md
def test_readme_is_short():
    lines = README.count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): detail belongs in "
        "results/README.md or docs/")


@pytest.mark.parametrize("heading, first, second", [
    ("Set up and run", "pip install -e ", "nmgen tune "),
    ("Set up and test", 'pip install -e ".[test]"', "python -m pytest"),
])
def test_readme_has_a_two_command_block(heading, first, second):
    """Each set-up section opens with one block of exactly two commands: install, then
    run (or test)."""
    blocks = fenced_blocks(section(README, heading))
    assert blocks, f"'## {heading}' has no command block"
    commands = [line for line in blocks[0] if line.strip() and not line.startswith("#")]
    assert len(commands) == 2, f"'## {heading}' block holds {commands}, not two commands"
    assert commands[0].startswith(first) and commands[1].startswith(second), commands


def test_ci_installs_and_tests_as_the_readme_says():
    """CI runs the README's test commands (quietly, with python3)."""
    install, test = (line for line in fenced_blocks(section(README, "Set up and test"))[0]
                     if line.strip())
    ci = (ROOT / ".ci" / "run").read_text()
    extras = install.split()[-1]
    assert re.search(rf"pip install (-q )?-e {re.escape(extras)}", ci), \
        f"CI does not install {extras}"
    assert test.replace("python ", "python3 ") in ci, f"CI does not run {test!r}"


def test_readme_embeds_a_plot_of_the_records():
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", README)
    plots = [p for p in images if p.startswith("results/") and p.endswith(".png")]
    assert plots, "README.md embeds no plot from results/"
    for plot in plots:
        data = (ROOT / plot).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{plot} is not a PNG"


@pytest.mark.parametrize("doc", ["README.md", "docs/design.md", "docs/nn.md",
                                 "docs/bad-input.md", "results/README.md"])
def test_cited_records_exist(doc):
    text = (ROOT / doc).read_text()
    base = ROOT / "results" if doc == "results/README.md" else ROOT
    paths = set(RESULTS_PATH.findall(text))
    if doc == "results/README.md":  # entries are named relative to results/
        paths |= {p for p in re.findall(r"`([a-z0-9_]+_h[0-9x]+[A-Za-z0-9_./-]*)`", text)}
    missing = sorted(p for p in paths if not (base / p).exists() and not (ROOT / p).exists())
    assert not missing, f"{doc} cites records that do not exist: {missing}"


def results_sections() -> list[str]:
    """The bodies of the README's ``## Results (GPU)...`` sections."""
    return [m.group(1) for m in re.finditer(r"^## Results \(.*?$(.*?)(?=^## |\Z)", README,
                                            re.M | re.S)]


def test_readme_results_come_from_the_records_it_cites():
    """Every decimal figure of each block of the README's results sections (a bold lead
    paragraph, its table and the paragraphs up to the next one) is a number of a record
    that the block cites, as written or rounded to the figure's decimals: a figure no
    record holds is not a result."""
    blocks = [block for body in results_sections() for block in re.split(r"\n(?=\*\*)", body)]
    assert len(blocks) >= 4
    for block in blocks:
        figures, records = results_figures(block)
        if not figures:
            continue
        assert records, f"a results block cites no record: {block.strip()[:60]!r}"
        missing = sorted({f for f in figures if not held_by(f, records)}, key=float)
        assert not missing, f"README results figures found in no record the block cites: " \
            f"{missing} ({block.strip()[:60]!r})"


RECORD_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.]*\d)")


@functools.lru_cache(maxsize=8)
def record_numbers(records: str) -> frozenset[float]:
    return frozenset(float(n) for n in RECORD_NUMBER.findall(records.replace(",", "")))


def held_by(figure: str, records: str) -> bool:
    """Whether some number of ``records`` is ``figure`` at the figure's decimals."""
    decimals = len(figure.partition(".")[2])
    return any(f"{x:.{decimals}f}" == figure for x in record_numbers(records))


def test_a_figure_is_held_only_by_a_number_that_rounds_to_it():
    assert held_by("1.49", "x 1.4912 y") and held_by("0.94", "0.935")
    assert not held_by("0.93", "10.937 and 0.9372") and not held_by("2.17", "2.175e3")


def summary_of(record: Path) -> str:
    """A record's text, less a bench table's per-shape part (``## Every shape``: a README
    figure is a summary's, and hundreds of per-shape numbers would hold almost any)."""
    text = record.read_text(errors="ignore")
    return text.split("\n## Every shape", 1)[0] if record.suffix == ".md" else text


def results_figures(body: str) -> tuple[list[str], str]:
    """A results section's decimal figures, and the text of the records it cites (files,
    and the files under cited folders)."""
    cited = set(RESULTS_PATH.findall(body))
    text = []
    for path in sorted(cited):
        target = ROOT / path
        files = [target] if target.is_file() else sorted(target.rglob("*")) if target.is_dir() \
            else []
        text += [summary_of(f) for f in files
                 if f.is_file() and f.suffix in (".md", ".txt", ".json", ".csv", ".log")]
    prose = re.sub(r"`[^`]*`", "", body)  # names and paths are not figures
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # nor are image links
    figures = [n.replace(",", "") for n in re.findall(r"(?<![\w.:])\d[\d,]*\.\d+", prose)]
    return figures, "\n".join(text)


def test_readme_says_which_gpu_the_figures_come_from():
    assert len(results_figures(section(README, "Results (H100)"))[0]) > 50
    assert "NVIDIA H100 80GB HBM3" in section(README, "Results (H100)")
    h200 = section(README, "Results (H200): element-wise 2:4 on the sparse tensor cores")
    assert "NVIDIA H200" in h200


def test_readme_links_the_documents():
    for doc in ("docs/design.md", "results/README.md", "docs/engineering-notes.md",
                "docs/nn.md", "docs/bad-input.md"):
        assert doc in README, f"README.md does not link {doc}"
        assert (ROOT / doc).exists(), doc


# ------------------------------------------------------------------ docs/design.md
def test_design_sections_are_numbered_in_order():
    numbers = [int(n) for n in re.findall(r"^## (\d+)\. ", DESIGN, re.M)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 9, numbers


def test_design_citations_name_sections_it_has():
    cited = cited_sections("docs/design.md")
    assert len(cited) >= 10, "the code cites docs/design.md sections (at least 10 expected)"
    have = numbered_sections(DESIGN)
    missing = sorted({(path, n) for path, n in cited if n not in have})
    assert not missing, f"citations of docs/design.md sections it lacks: {missing}"


def test_no_citation_of_a_design_document_outside_the_project():
    """``DESIGN §N`` named a document the project does not hold: cite docs/design.md."""
    bare = [(path, m.group(0)) for path, text in code_text()
            for m in re.finditer(r"(?<![/\w.])DESIGN\s+§\d+", text)]
    assert not bare, f"cite docs/design.md §N instead: {bare}"


@pytest.mark.parametrize("number, words", [
    (1, ("format",)), (2, ("famil",)), (3, ("model",)), (4, ("measur",)),
    (8, ("tensor-core",)), (9, ("decode",)),
])
def test_design_sections_hold_the_topics_the_code_cites_them_for(number, words):
    heading = re.search(rf"^## {number}\. (.*)$", DESIGN, re.M)
    assert heading, f"docs/design.md has no section {number}"
    assert any(w in heading.group(1).lower() for w in words), heading.group(1)


# ------------------------------------------------------------------ docs/engineering-notes.md
def test_notes_are_one_sitting():
    lines = NOTES.count("\n")
    assert lines <= NOTES_MAX_LINES, (
        f"docs/engineering-notes.md has {lines} lines (at most {NOTES_MAX_LINES}): fold "
        "superseded lessons into one line each")


def test_notes_citations_name_sections_they_have():
    cited = cited_sections("engineering-notes.md")
    assert cited, "the code cites the notes' sections"
    have = numbered_sections(NOTES)
    missing = sorted({(path, n) for path, n in cited if n not in have})
    assert not missing, f"citations of engineering-notes sections it lacks: {missing}"


def test_notes_headings_the_code_names_exist():
    named = {m.group(1) for _, text in code_text()
             for m in re.finditer(r'engineering-notes\.md,\s+"([^"]+)"', text)}
    headings = re.findall(r"^## (.*)$", NOTES, re.M)
    missing = sorted(n for n in named if not any(n in h for h in headings))
    assert not missing, f"notes headings named by the code but absent: {missing}"
