"""Where a script's batches came from when it iterated no DataLoader: what to pass to ``--batches``.

nanoGPT's ``get_batch(split)``, modded-nanogpt's ``next(generator)``, build-nanogpt's
``loader.next_batch()``: the model is fed by a function of the script, and nothing is recorded. At the
model's first call (a global forward pre-hook, removed after it fires) :class:`FirstInputs` reads the
user's line that called the model and the statements that assigned its arguments, and names the
script's function the inputs came from, as ``--batches`` accepts it (``get_batch``,
``DataLoaderLite.next_batch``, ``data:get_batch``). Only a hint for a one-line message: "" where the
source does not say.
"""

from __future__ import annotations

import ast
import inspect
import linecache
import sys
from collections.abc import Callable, Iterator
from types import FrameType, FunctionType, MethodType, ModuleType
from typing import Any

from ddpcheck.launch.userfiles import is_user_file, shown_path
from ddpcheck.messages import one_line


class FirstInputs:
    """Names the source of the model's first inputs, unless a DataLoader was iterated before it."""

    def __init__(self, loaders_seen: Callable[[], bool]) -> None:
        self.loaders_seen = loaders_seen
        self.name = ""  # what --batches would take ("" unknown)
        self.site = ""  # "train.py:88 (model(X, Y))": the user's line that called the model first
        self.handle: Any = None

    def install(self) -> None:
        from torch.nn.modules.module import register_module_forward_pre_hook

        self.handle = register_module_forward_pre_hook(self._first_call)

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def _first_call(self, module: Any, args: Any) -> None:
        self.remove()
        if self.loaders_seen():
            return
        try:
            frame = _user_frame(sys._getframe(1))
            if frame is not None:
                self.name, self.site = source_of_inputs(frame)
        except Exception:  # a hint only: never the script's problem
            self.name = ""


def _user_frame(frame: FrameType | None) -> FrameType | None:
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def source_of_inputs(frame: FrameType) -> tuple[str, str]:
    """(the --batches name of the function the call at ``frame``'s line took its inputs from, or "";
    ``file:line (source)`` of that line)."""
    code = frame.f_code
    line = frame.f_lineno
    text = one_line(linecache.getline(code.co_filename, line).strip(), 80)
    site = f"{shown_path(code.co_filename)}:{line}" + (f" ({text})" if text else "")
    scope = _scope(code.co_filename, line)
    if scope is None:
        return "", site
    for call in _calls_on(scope, line):
        for expression in _sources(scope, call):
            name = _describe(expression, frame)
            if name:
                return name, site
    return "", site


def _scope(filename: str, line: int) -> ast.AST | None:
    """The innermost function (else the module) of ``filename`` that holds ``line``."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None
    best: ast.AST = tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            end = getattr(node, "end_lineno", None) or node.lineno
            if node.lineno <= line <= end and node.lineno >= getattr(best, "lineno", 0):
                best = node
    return best


def _calls_on(scope: ast.AST, line: int) -> Iterator[ast.Call]:
    for node in ast.walk(scope):
        if isinstance(node, ast.Call) and node.lineno <= line <= (node.end_lineno or node.lineno):
            yield node


def _sources(scope: ast.AST, call: ast.Call) -> Iterator[ast.expr]:
    """The expressions the call's arguments came from: a call among them, or what a name was assigned
    (``X, Y = get_batch("train")``; ``for x, y in stream``) anywhere in the scope."""
    arguments = [*call.args, *(k.value for k in call.keywords)]
    for argument in arguments:
        inner = argument.value if isinstance(argument, ast.Starred) else argument
        if isinstance(inner, ast.Call):
            yield inner
        for name in (n.id for n in ast.walk(inner) if isinstance(n, ast.Name)):
            yield from _assigned(scope, name)


def _assigned(scope: ast.AST, name: str) -> Iterator[ast.expr]:
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and any(_binds(t, name) for t in node.targets):
            yield node.value
        elif isinstance(node, (ast.For, ast.AsyncFor)) and _binds(node.target, name):
            yield node.iter
        elif isinstance(node, ast.withitem) and _binds(node.optional_vars or ast.Tuple(elts=[]), name):
            yield node.context_expr


def _binds(target: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target))


def _describe(expression: ast.expr, frame: FrameType) -> str:
    """The --batches name of what ``expression`` calls or iterates, where that is the user's code."""
    if isinstance(expression, ast.Call):
        func = expression.func
        if isinstance(func, ast.Name) and func.id == "next" and expression.args:
            return _iterator_name(_resolve(expression.args[0], frame))
        if isinstance(func, ast.Attribute):
            owner = _resolve(func.value, frame)
            if owner is None:
                return ""
            return _function_name(getattr(owner, func.attr, None))
        return _function_name(_resolve(func, frame))
    return _iterator_name(_resolve(expression, frame))


def _resolve(expression: ast.expr, frame: FrameType) -> Any:
    """The value of a name or a dotted name in ``frame`` (None: anything else, or unknown)."""
    if isinstance(expression, ast.Name):
        for space in (frame.f_locals, frame.f_globals, frame.f_builtins):
            if expression.id in space:
                return space[expression.id]
        return None
    if isinstance(expression, ast.Attribute):
        owner = _resolve(expression.value, frame)
        return None if owner is None else getattr(owner, expression.attr, None)
    return None


def _function_name(value: Any) -> str:
    if isinstance(value, MethodType):
        owner = value.__self__
        kind = owner if isinstance(owner, type) else type(owner)
        function = value.__func__
        if not isinstance(function, FunctionType) or not is_user_file(function.__code__.co_filename):
            return ""
        return _qualified(kind.__module__, f"{kind.__qualname__}.{function.__name__}")
    if isinstance(value, FunctionType) and is_user_file(value.__code__.co_filename):
        return _qualified(value.__module__, value.__qualname__)
    return ""


def _iterator_name(value: Any) -> str:
    """A generator of the user's code, or an object whose class (the user's) defines ``__next__``."""
    if inspect.isgenerator(value):
        code = value.gi_code
        if not is_user_file(code.co_filename):
            return ""
        qualname = getattr(code, "co_qualname", code.co_name)
        module = value.gi_frame.f_globals.get("__name__", "") if value.gi_frame is not None else ""
        return _qualified(module, qualname)
    kind = type(value)
    method = getattr(kind, "__next__", None)
    if isinstance(method, FunctionType) and is_user_file(method.__code__.co_filename):
        return _qualified(kind.__module__, f"{kind.__qualname__}.__next__")
    return ""


def _qualified(module: str, qualname: str) -> str:
    """``get_batch`` for the script's own names, ``data:get_batch`` for a module's."""
    if "<locals>" in qualname:
        return ""
    main = sys.modules.get("__main__")
    if not module or module == "__main__" or (isinstance(main, ModuleType) and main.__name__ == module):
        return qualname
    return f"{module}:{qualname}"
