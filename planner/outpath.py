"""Whether a file a command writes at its end can be written there, checked before the work: a profile or a
run that takes minutes must not end in a traceback because its ``--out`` folder is missing (issue 13, QA on a
fresh clone). Pure Python (pathlib): the command lines of every package use it."""

from __future__ import annotations

from pathlib import Path


def shown(path: str | Path, most: int = 80) -> str:
    """``path`` as a message shows it: its first ``most`` characters, and "..." when it is longer."""
    text = str(path)
    return text if len(text) <= most else text[:most] + "..."


def out_problem(path: str | Path | None, option: str = "--out") -> str | None:
    """Why ``path`` cannot be written (its folder is missing or is a file, or it is a folder), or None."""
    if path is None:
        return None
    p = Path(path)
    try:
        if p.is_dir():
            return f"{option} {p}: is a folder; give a file name"
    except OSError as e:  # a name too long for the file system, a loop of links
        return f"{option} {shown(p)}: {e.strerror or e}"
    return parent_problem(p, option)


def parent_problem(path: str | Path, option: str = "--out") -> str | None:
    """Why the folder ``path`` is to be written in (a file, or a folder to be made) is not there (missing, or a
    file), or None. Missing folders are not made: a mistyped path is refused, not created."""
    p = Path(path)
    try:
        parent = p.parent
        if not parent.exists():
            return f"{option} {p}: the folder {parent} does not exist"
        if not parent.is_dir():
            return f"{option} {p}: {parent} is not a folder"
    except OSError as e:  # a name too long for the file system, a loop of links
        return f"{option} {shown(p)}: {e.strerror or e}"
    return None
