"""What code is the user's: frames in files outside the standard library, the installed packages and
ddpcheck (which files: :mod:`ddpcheck.launch.userfiles`). A script's loader is named by the user's line
that built it (``train.py:42``), and an error by the user's line that raised it; a report calls the
loader by the variable that line assigns it to (``train_loader``)."""

from __future__ import annotations

import ast
import linecache
import traceback
from types import CodeType, FrameType

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


# --- the name a loader is given by the user's code --------------------------------------------------------

_STATEMENTS: dict[str, list[ast.stmt]] = {}
_RETURNS = 4  # helpers returning a loader followed out to the call that assigns it, at most this deep


def assigned_name(frame: FrameType | None) -> str:
    """The variable the user's line (the innermost user frame from ``frame`` out) assigns what it builds
    to: ``train_loader`` for ``train_loader = DataLoader(...)`` (a statement over several lines too),
    ``train_loader`` for ``self.train_loader = ...``, ``"train"`` for ``loaders["train"] = ...``, the
    matching element of ``a, b = DataLoader(x), DataLoader(y)``. A ``return`` is followed to its caller's
    assignment where the caller is the user's (``val_loader = make_loader("val")``), else the function's
    own name (Lightning calls ``train_dataloader``; ``fit(get_loader())`` assigns none); ``for batch in
    train_loader:`` names the loader it iterates. "" where the line assigns no name (``trainer.train()``)
    or cannot be read."""
    user = frame
    while user is not None and not is_user_file(user.f_code.co_filename):
        user = user.f_back
    element: int | None = None  # the element of a returned tuple the loader is
    helper = ""  # the user's function that returned it
    for _ in range(_RETURNS):
        if user is None:
            break
        statement = _statement(user.f_code.co_filename, user.f_lineno)
        at = _position(user)
        if not isinstance(statement, ast.Return):
            name = _target_of(statement, at, element) if statement is not None else ""
            return name or helper
        name = user.f_code.co_name
        helper = name if name.isidentifier() and element is None else ""  # not <module>, <lambda>
        caller = user.f_back
        if caller is None or not is_user_file(caller.f_code.co_filename):
            return helper
        if isinstance(statement.value, ast.Tuple) and element is None:
            element = next((i for i, e in enumerate(statement.value.elts) if at and _spans(e, at)), None)
            if element is None:
                return ""
        user = caller
    return helper


def _statement(filename: str, line: int) -> ast.stmt | None:
    """The innermost statement of ``filename`` that spans ``line`` (the file parsed once)."""
    if filename not in _STATEMENTS:
        try:
            tree = ast.parse("".join(linecache.getlines(filename)))
        except (SyntaxError, ValueError):
            tree = None
        _STATEMENTS[filename] = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)] if tree else []
    spanning = [s for s in _STATEMENTS[filename] if s.lineno <= line <= (s.end_lineno or s.lineno)]
    # the shortest; of equal spans (``if ok: loader = DataLoader(...)``) the deepest, walked last
    return min(reversed(spanning), key=lambda s: (s.end_lineno or s.lineno) - s.lineno, default=None)


def _position(frame: FrameType) -> tuple[int, int] | None:
    """(line, column) where the frame's current instruction starts (the call it is in); None where
    Python keeps no columns (3.10)."""
    code: CodeType = frame.f_code
    positions = getattr(code, "co_positions", None)
    if positions is None or frame.f_lasti < 0:
        return None
    for index, position in enumerate(positions()):
        if index == frame.f_lasti // 2:
            line, _, column, _ = position
            return (line, column) if line is not None and column is not None else None
    return None


def _target_of(statement: ast.stmt, at: tuple[int, int] | None, element: int | None) -> str:
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        return _named(statement.targets[0], statement.value, at, element)
    if isinstance(statement, ast.AnnAssign) and statement.value is not None:
        return _named(statement.target, statement.value, at, element)
    if isinstance(statement, (ast.For, ast.AsyncFor)) and element is None:
        return _plain_name(statement.iter)
    return ""


def _named(target: ast.expr, value: ast.expr, at: tuple[int, int] | None, element: int | None) -> str:
    """The name ``target = value`` gives the call at ``at``: an element of a tuple for a tuple; the
    ``element``-th of the targets where the call returned a tuple whose ``element``-th is the loader."""
    if element is not None:
        elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else []
        return _plain_name(elts[element]) if element < len(elts) else ""
    if isinstance(target, (ast.Tuple, ast.List)):
        if not isinstance(value, (ast.Tuple, ast.List)) or len(value.elts) != len(target.elts) or at is None:
            return ""
        for name, made in zip(target.elts, value.elts, strict=True):
            if _spans(made, at):
                return _plain_name(name)
        return ""
    return _plain_name(target)


def _spans(node: ast.expr, at: tuple[int, int]) -> bool:
    start = (node.lineno, node.col_offset)
    end = (node.end_lineno or node.lineno, node.end_col_offset or 0)
    return start <= at < end


def _plain_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        key = node.slice.value
        return key if isinstance(key, str) and key.isidentifier() else ""
    return ""
