"""What code is the user's: frames in files outside the standard library, the installed packages and
ddpcheck (which files: :mod:`ddpcheck.launch.userfiles`). A script's loader is named by the user's line
that built it (``train.py:42``), and an error by the user's line that raised it."""

from __future__ import annotations

import ast
import linecache
import traceback
from types import FrameType

from ddpcheck.launch.userfiles import is_user_file, shown_path


def user_site(frame: FrameType | None) -> tuple[str, str]:
    """(``train.py:42`` of the innermost user frame, the library function between it and torch)."""
    via = ""
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return f"{shown_path(code.co_filename)}:{frame.f_lineno}", via
        module = frame.f_globals.get("__name__", "")
        if not via and not str(module).startswith(("torch.", "ddpcheck.")):
            via = code.co_name
        frame = frame.f_back
    return "<unknown>", via


def user_line(exc: BaseException) -> str:
    """``train.py:17`` and its source line: the innermost frame of the user's code in the traceback."""
    found = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if is_user_file(frame.filename):
            found = f"{shown_path(frame.filename)}:{frame.lineno}" + (
                f" ({frame.line.strip()})" if frame.line else ""
            )
    return found


def call_at(frame: FrameType, names: tuple[str, ...]) -> str:
    """The call the user's line (the innermost user frame from ``frame`` out) makes, as written
    (``random_split(data, [0.9, 0.1])``, cut to 80 characters): to the first of ``names`` met on the way
    there, else to the last of ``names`` (what ``frame`` itself runs); the name alone where the line
    cannot be read."""
    crossed: list[str] = []
    user: FrameType | None = frame
    while user is not None and not is_user_file(user.f_code.co_filename):
        crossed.append(user.f_code.co_name)
        user = user.f_back
    wanted = [n for n in names if n in crossed] or list(names[-1:])
    if user is None or not wanted:
        return wanted[0] if wanted else ""
    line = linecache.getline(user.f_code.co_filename, user.f_lineno).strip()
    tree = None
    for text in (line, f"{line} pass"):  # a compound statement's header: "for x in Subset(...):"
        try:
            tree = ast.parse(text)
            break
        except SyntaxError:
            continue
    if tree is None:
        return wanted[0]
    for node in ast.walk(tree):
        func = node.func if isinstance(node, ast.Call) else None
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if name in wanted:
            text = ast.get_source_segment(line, node) or name
            return text if len(text) <= 80 else f"{text[:77]}..."
    return wanted[0]
