"""The results files ``nmt-table`` reads: ``table.results_glob`` (``runs/**/results.json``)
walked as ``glob.glob(recursive=True)`` would, but each real file once and never round a loop.

``glob`` follows every symlink to a folder: ``runs/latest -> smoke`` gives a run twice, a link
loop (``runs/loop -> .``) multiplies the files found until paths grow too long, and a link to
the parent (``runs/up -> ..``) reaches files outside ``runs/``.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

_MAGIC = re.compile(r"[*?[]")


def _component_matches(name: str, pat: str) -> bool:
    if not _MAGIC.search(pat):
        return name == pat
    if name.startswith(".") and not pat.startswith("."):
        return False  # as glob: a wildcard never matches a hidden name
    return fnmatch.fnmatchcase(name, pat)


def _closure(states: set[int], pats: list[str]) -> set[int]:
    out = set(states)
    for i in sorted(states):
        j = i
        while j < len(pats) and pats[j] == "**":
            j += 1
            out.add(j)
    return out


def _advance(states: set[int], name: str, pats: list[str]) -> set[int]:
    nxt = set()
    for i in states:
        if i == len(pats):
            continue
        if pats[i] == "**":
            if not name.startswith("."):
                nxt.add(i)
        elif _component_matches(name, pats[i]):
            nxt.add(i + 1)
    return _closure(nxt, pats)


def find_results_files(pattern: str) -> list[str]:
    """The files matching the glob ``pattern`` (``**`` for any folders, as
    ``glob.glob(recursive=True)``), each real file once, sorted.

    Unlike ``glob``, a folder reached twice (through a symlink) is walked once, by its own
    path where it has one; a symlink to a folder that holds the one being walked, or the
    pattern's fixed start (``runs/``), is a loop and is not followed (one warning line); a
    file reached by several paths (``runs/latest -> smoke``, a hard link) is counted once,
    by the path without a symlink where there is one (one info line for each other path).
    """
    parts = list(Path(pattern).parts)
    first = next((i for i, p in enumerate(parts) if _MAGIC.search(p)), len(parts))
    if first == len(parts):
        return [pattern] if os.path.lexists(pattern) else []
    root = os.path.join(*parts[:first]) if first else "."
    pats = parts[first:]
    if not os.path.isdir(root):
        return []
    root_real = os.path.realpath(root)
    visited: set[tuple[int, int]] = set()
    found: list[str] = []
    links: list[tuple[str, set[int]]] = []

    def holds(real: str, inner: str) -> bool:
        return inner == real or inner.startswith(real.rstrip(os.sep) + os.sep)

    def enter(path: str, states: set[int], follow: bool) -> None:
        real = os.path.realpath(path)
        if follow and (holds(real, root_real) or holds(real, os.path.realpath(
                os.path.dirname(path) or "."))):
            log.warning("not following %s: a link to %s, which holds %s (a loop)", path,
                        real, os.path.dirname(path) or ".")
            return
        try:
            st = os.stat(path)
        except OSError:
            return
        if (st.st_dev, st.st_ino) in visited:
            return
        visited.add((st.st_dev, st.st_ino))
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            nxt = _advance(states, entry.name, pats)
            if not nxt:
                continue
            child = entry.name if path == "." and not first else os.path.join(path, entry.name)
            if len(pats) in nxt:
                found.append(child)
            try:
                is_dir = entry.is_dir()
            except OSError:
                continue
            if not is_dir or not nxt - {len(pats)}:
                continue
            if entry.is_symlink() and not follow:
                links.append((child, nxt))
            else:
                enter(child, nxt, follow)

    enter(root, _closure({0}, pats), follow=False)  # every folder by its own path first
    for path, states in links:  # then those reached only through a symlink
        enter(path, states, follow=True)
    seen: dict[tuple[int, int], str] = {}
    out = []
    for path in sorted(found, key=lambda p: (os.path.realpath(p) != os.path.abspath(p), p)):
        try:
            st = os.stat(path)
        except OSError:
            out.append(path)  # a broken link: its reader names it
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            log.info("%s is %s (a link): counted once", path, seen[key])
            continue
        seen[key] = path
        out.append(path)
    return sorted(out)
