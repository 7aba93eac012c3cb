"""The pages a user reads say what exists: every repository path, ``transformer_nmt`` module
(or name in one) and ``make`` target named in README.md and docs/*.md is there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

TOP = ("src", "tests", "scripts", "docs", "configs")
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(TOP)})/[\w./*<>{{}},-]*[\w*>}}])")
"""A path below one of the repository's top-level folders, as pages write it."""
FILE = re.compile(r"(?<![\w./<$-])([A-Za-z_][\w-]*\.(?:py|sh|yaml))\b")
"""A bare file name (``bench_common.py``): some file of the repository has it."""
MODULE = re.compile(r"(?<![\w.])(transformer_nmt(?:\.\w+)+)")
"""A dotted name in the package (``transformer_nmt.json``, a file name, is not one)."""
MAKE = re.compile(r"(?<![\w-])make ([a-z][\w-]*)")
"""Searched in code only (inline spans and fenced blocks): ``make train``, not 'a make target'."""
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")

NOT_OURS = {
    # files of other projects that the pages cite by their own paths
    "scripts/tokenizer/tokenizer.perl", "scripts/generic/multi-bleu.perl",
    "scripts/share/nonbreaking_prefixes/nonbreaking_prefix.{de,en,fr}",
    "scripts/tokenizer/replace-unicode-punctuation.perl",
    "scripts/average_checkpoints.py", "average_checkpoints.py", "get_ende_bleu.sh", "evaluate.sh",
    "compound_split_bleu.sh", "scripts/compound_split_bleu.sh",
    "generate.py", "train.py", "model.py", "src/decoding.cc",
}
EXAMPLES = {
    # files a page writes out in full in front of the reader before running them
    "probe.py",
}
WRITTEN_BY_COMMANDS = {
    # what a command writes, named before it exists in a fresh clone, or the stem it adds
    # suffixes to (commands write under runs/, which is not checked, unless asked to rebuild a
    # committed page: TABLE3_PROXY_OUT=docs/table3_proxy writes docs/table3_proxy.md and .png)
    "docs/table3_proxy",
}


def _pages() -> list[tuple[str, str]]:
    return [(str(p.relative_to(REPO)), p.read_text(encoding="utf-8")) for p in PAGES]


def _exists(path: str) -> bool:
    path = path.rstrip(".,")
    if "<" in path:  # a placeholder: the folder before it exists
        path = path[:path.index("<")].rsplit("/", 1)[0]
    if "{" in path:
        head, alts = path.split("{", 1)
        alts, tail = alts.split("}", 1)
        return all(_exists(head + a + tail) for a in alts.split(","))
    if "*" in path:
        return any(REPO.glob(path))
    return (REPO / path).exists()


def _module_file(dotted: str) -> Path | None:
    base = SRC.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_exists(dotted: str) -> bool:
    """``a.b.c`` is a module, or ``a.b`` is one that defines ``c`` (``.c.d``: attributes)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        found = _module_file(".".join(parts[:cut]))
        if found is not None:
            if cut == len(parts):
                return True
            name = parts[cut]
            return re.search(rf"^\s*(def|class) {name}\b|^\s*{name}\s*[:=]|\b{name}\b",
                             found.read_text(encoding="utf-8"), re.M) is not None
    return False


def _make_targets() -> set[str]:
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([a-z][\w-]*)\s*:(?!=)", text, re.M)}


BASENAMES = {p.name for p in REPO.rglob("*") if ".git" not in p.parts and ".venv" not in p.parts}


def test_every_path_named_on_a_page_exists():
    wrong = {}
    for page, text in _pages():
        paths = sorted({m.group(1).rstrip(".,") for m in PATH.finditer(text)}
                       - NOT_OURS - WRITTEN_BY_COMMANDS)
        bare = {m.group(1) for m in FILE.finditer(text)} - NOT_OURS - EXAMPLES - BASENAMES
        links = {m.group(1) for m in LINK.finditer(text)
                 if "://" not in m.group(1) and not ((REPO / page).parent / m.group(1)).exists()}
        missing = sorted({p for p in paths if not _exists(p)} | bare | links)
        if missing:
            wrong[page] = missing
    assert not wrong, f"pages name what is not in the repository: {wrong}"


def test_every_module_named_on_a_page_exists():
    wrong = {}
    for page, text in _pages():
        names = {m.group(1) for m in MODULE.finditer(text) if not m.group(1).endswith(".json")}
        if missing := sorted(n for n in names if not _module_exists(n)):
            wrong[page] = missing
    assert not wrong, f"pages name modules that do not exist: {wrong}"


def test_every_make_target_named_on_a_page_exists():
    targets, wrong = _make_targets(), {}
    for page, text in _pages():
        code = "\n".join(CODE.findall(text))
        if missing := sorted({m.group(1) for m in MAKE.finditer(code)} - targets):
            wrong[page] = missing
    assert not wrong, f"pages name make targets that the Makefile lacks: {wrong}"


def test_the_checks_find_what_is_missing():
    page = ("`tests/test_bleu.py`, `transformer_nmt.bleu`, `make bleu`, [x](nowhere.md), "
            "`bench_nothing.py`; `scripts/bench/bench_common.py`, `make test-fast`, "
            "`transformer_nmt.model.flops.PEAK_FLOPS`, `configs/experiment/<name>.yaml`")
    assert [p for p in (m.group(1) for m in PATH.finditer(page)) if not _exists(p)] == [
        "tests/test_bleu.py"]
    assert [m.group(1) for m in MODULE.finditer(page) if not _module_exists(m.group(1))] == [
        "transformer_nmt.bleu"]
    assert {m.group(1) for m in MAKE.finditer(page)} - _make_targets() == {"bleu"}
    assert {m.group(1) for m in FILE.finditer(page)} - BASENAMES == {"bench_nothing.py"}
    assert [m.group(1) for m in LINK.finditer(page)] == ["nowhere.md"]
