"""User tasks: a reward function, formatters and data files named by the user, built into a ``Task``.

A user task is a Python module (dotted name or ``path/to/file.py``) plus data. By convention the module
defines ``reward_func`` (CoMLRL's calling convention, see ``rewards``), optionally ``formatters`` (one
callable or a list with one per agent), ``reward_processor``, ``NUM_AGENTS``, ``NAME``, ``TITLE``,
``DESCRIPTION``, ``REWARD_RANGE`` and ``DATA_PATH`` / ``EVAL_DATA_PATH`` (relative to the module's file).
Every one of them can be overridden by an argument, and any object can be named by an import path,
``"package.module:attr"`` or ``"path/to/file.py:attr"``, which is how the workbench and config files
refer to user code.

This module imports and checks user code; it does not call the reward function (``rewards`` does) and
never imports torch. Errors are ``UserTaskError`` (a ``ValueError``) with the path in the message.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import ModuleType
from typing import Any

from comlrl_lab.data.datasets import load_items, require_prompt_key
from comlrl_lab.data.formatters import resolve_formatters

__all__ = ["UserTaskError", "UserTaskSpec", "load_module", "load_object", "load_user_task"]

#: CoMLRL's trainer default when nothing else fixes the agent count.
DEFAULT_NUM_AGENTS = 2


class UserTaskError(ValueError):
    """User task code or data could not be loaded; the message names the path, the cause is chained."""


# --------------------------------------------------------------------------------------------------
# Import paths


def _is_file_ref(ref: str) -> bool:
    return ref.endswith(".py") or "/" in ref or "\\" in ref


def load_module(ref: str | os.PathLike[str] | ModuleType) -> ModuleType:
    """Import a module by dotted name or by ``.py`` file path (re-executed when the file changes)."""
    if isinstance(ref, ModuleType):
        return ref
    ref = os.fspath(ref)
    if not isinstance(ref, str) or not ref.strip():
        raise UserTaskError(f"expected a module name or a path to a .py file, got {ref!r}")
    ref = ref.strip()
    if _is_file_ref(ref):
        return _load_file_module(Path(ref))
    return _import_dotted(ref)


def load_object(spec: str) -> Any:
    """The object named by ``"package.module:attr"`` or ``"path/to/file.py:attr"`` (dots walk attributes)."""
    if not isinstance(spec, str) or ":" not in spec:
        raise UserTaskError(f"expected 'package.module:attribute' or 'path/to/file.py:attribute', got {spec!r}")
    module_ref, _, attr_path = spec.strip().rpartition(":")
    parts = attr_path.split(".")
    if not module_ref or not all(part.isidentifier() for part in parts):
        raise UserTaskError(f"expected 'package.module:attribute' or 'path/to/file.py:attribute', got {spec!r}")
    obj: Any = load_module(module_ref)
    for depth, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            owner = module_ref if depth == 0 else ".".join(parts[:depth])
            hint = ""
            if depth == 0:
                names = [n for n in vars(obj) if not n.startswith("_") and callable(getattr(obj, n))]
                hint = f"; it defines: {', '.join(sorted(names)[:20]) or 'no public callables'}"
            raise UserTaskError(f"{spec!r}: {owner!r} has no attribute {part!r}{hint}") from None
    return obj


def _import_dotted(name: str) -> ModuleType:
    if not all(part.isidentifier() for part in name.split(".")):
        raise UserTaskError(f"{name!r} is not a module name; for a file use 'path/to/file.py'")
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise UserTaskError(
                f"cannot find module {name!r}: it is not installed or not on sys.path "
                "(for a file use 'path/to/file.py:attribute')"
            ) from exc
        raise UserTaskError(f"importing module {name!r} failed: {exc}") from exc
    except SyntaxError as exc:
        raise UserTaskError(
            f"module {name!r} has a syntax error in {exc.filename} line {exc.lineno}: {exc.msg}"
        ) from exc
    except Exception as exc:
        raise UserTaskError(f"importing module {name!r} raised {type(exc).__name__}: {exc}") from exc


_file_modules: dict[Path, tuple[tuple[int, int], ModuleType]] = {}
_file_modules_lock = threading.Lock()


def _load_file_module(path: Path) -> ModuleType:
    path = path.expanduser()
    if not path.is_file():
        raise UserTaskError(f"task module file not found: {path}")
    if path.suffix != ".py":
        raise UserTaskError(f"{path}: a task module must be a .py file")
    path = path.resolve()
    stat = path.stat()
    stamp = (stat.st_mtime_ns, stat.st_size)
    with _file_modules_lock:
        cached = _file_modules.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        # A unique, stable name: functions defined in the file stay picklable and two files named
        # task.py in different folders do not collide.
        digest = hashlib.sha1(str(path).encode("utf-8")).hexdigest()[:10]
        module_name = f"_comlrl_lab_user_{''.join(c if c.isalnum() else '_' for c in path.stem)}_{digest}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise UserTaskError(f"{path}: cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        # The folder is on sys.path while the file runs, so it can import helper modules next to it.
        folder = str(path.parent)
        added = folder not in sys.path
        if added:
            sys.path.insert(0, folder)
        try:
            spec.loader.exec_module(module)
        except SyntaxError as exc:
            sys.modules.pop(module_name, None)
            raise UserTaskError(f"{path} has a syntax error at line {exc.lineno}: {exc.msg}") from exc
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise UserTaskError(f"running {path} raised {type(exc).__name__}: {exc}") from exc
        finally:
            if added:
                with contextlib.suppress(ValueError):
                    sys.path.remove(folder)
        _file_modules[path] = (stamp, module)
        return module


# --------------------------------------------------------------------------------------------------
# The task


def _user_task_class() -> type:
    # Task is imported here, not at module level: comlrl_lab.data.tasks may itself import this module.
    global _USER_TASK_CLASS
    if _USER_TASK_CLASS is not None:
        return _USER_TASK_CLASS
    from comlrl_lab.data.tasks.base import Task

    @dataclass(frozen=True)
    class UserTask(Task):
        """A ``Task`` whose items come from the user's data; also carries the optional ``reward_processor``.

        ``reward_range`` is None when neither the reward function nor the module declares one.
        ``eval_items()`` is empty when no evaluation data was given (evaluation is then skipped).
        """

        reward_range: tuple[float, float] | None = None  # type: ignore[assignment]
        reward_processor: Callable[[float], float] | None = None
        train_data: tuple[Mapping[str, Any], ...] = field(default=(), repr=False)
        eval_data: tuple[Mapping[str, Any], ...] = field(default=(), repr=False)
        source: str = ""

        def train_items(self) -> list[dict]:
            return [dict(item) for item in self.train_data]

        def eval_items(self) -> list[dict]:
            return [dict(item) for item in self.eval_data]

    UserTask.__module__ = __name__
    UserTask.__qualname__ = "UserTask"
    _USER_TASK_CLASS = UserTask
    return UserTask


_USER_TASK_CLASS: type | None = None


def __getattr__(name: str) -> Any:  # `from comlrl_lab.data.user_tasks import UserTask` builds the class lazily
    if name == "UserTask":
        return _user_task_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _resolve_ref(value: Any, module: ModuleType | None, what: str) -> Any:
    """An object given directly, as an import path ("mod:attr", "file.py:attr") or as a name in ``module``."""
    if not isinstance(value, str):
        return value
    if ":" in value:
        return load_object(value)
    if module is None:
        raise UserTaskError(f"{what} {value!r} needs a module: use 'package.module:{value}' or 'file.py:{value}'")
    if not hasattr(module, value):
        raise UserTaskError(f"{what}: module {_module_label(module)!r} has no attribute {value!r}")
    return getattr(module, value)


def _module_label(module: ModuleType) -> str:
    return getattr(module, "__file__", None) or module.__name__


def _data_source(value: Any, module: ModuleType | None) -> Any:
    """Relative data paths named inside a module are relative to the module's folder."""
    if isinstance(value, (str, os.PathLike)) and module is not None and getattr(module, "__file__", None):
        path = Path(value)
        if not path.is_absolute():
            return Path(module.__file__).parent / path
    return value


def load_user_task(
    module: str | os.PathLike[str] | ModuleType | None = None,
    *,
    data: Any = None,
    eval_data: Any = None,
    reward: Any = None,
    formatters: Any = None,
    reward_processor: Any = None,
    num_agents: int | None = None,
    name: str | None = None,
    title: str | None = None,
    description: str | None = None,
) -> Any:
    """Build a ``Task`` (a ``UserTask``) from a user module and data.

    ``module`` is a dotted module name, a ``.py`` path or a module object. ``reward``, ``formatters`` and
    ``reward_processor`` may be objects, import paths or attribute names in ``module``; when omitted the
    module's ``reward_func``, ``formatters`` and ``reward_processor`` are used. ``data`` / ``eval_data`` take
    anything ``load_items`` reads; when omitted, the module's ``DATA_PATH`` / ``EVAL_DATA_PATH``.
    """
    mod = load_module(module) if module is not None else None
    label = _module_label(mod) if mod is not None else "user task"

    def convention(attr: str) -> Any:
        return getattr(mod, attr, None) if mod is not None else None

    reward_func = _resolve_ref(reward if reward is not None else convention("reward_func"), mod, "reward")
    if reward_func is None:
        raise UserTaskError(f"{label}: no reward function; define reward_func in the module or pass reward=...")
    if not callable(reward_func):
        raise UserTaskError(f"{label}: reward_func must be a callable.")

    fmts = formatters if formatters is not None else convention("formatters")
    if isinstance(fmts, (list, tuple)):
        fmts = [_resolve_ref(f, mod, "formatter") for f in fmts]
    else:
        fmts = _resolve_ref(fmts, mod, "formatters")

    processor = _resolve_ref(
        reward_processor if reward_processor is not None else convention("reward_processor"), mod, "reward_processor"
    )
    if processor is not None and not callable(processor):
        raise UserTaskError(f"{label}: reward_processor must be a callable.")

    if num_agents is None:
        num_agents = convention("NUM_AGENTS")
    if num_agents is None:
        num_agents = len(fmts) if isinstance(fmts, (list, tuple)) else DEFAULT_NUM_AGENTS
    try:
        resolved = resolve_formatters(fmts, num_agents)
    except ValueError as exc:
        raise UserTaskError(f"{label}: {exc}") from exc

    train_source = data if data is not None else _data_source(convention("DATA_PATH"), mod)
    if train_source is None:
        raise UserTaskError(f"{label}: no training data; pass data=... or define DATA_PATH in the module")
    eval_source = eval_data if eval_data is not None else _data_source(convention("EVAL_DATA_PATH"), mod)
    train_items = load_items(train_source)
    eval_items = load_items(eval_source) if eval_source is not None else []
    if fmts is None:
        require_prompt_key(train_items, source=_source_label(train_source))
        if eval_items:
            require_prompt_key(eval_items, source=_source_label(eval_source))

    reward_range = getattr(reward_func, "reward_range", None) or convention("REWARD_RANGE")
    if reward_range is not None:
        try:
            low, high = (float(v) for v in reward_range)
        except (TypeError, ValueError):
            low = high = float("nan")
        if not low < high:
            raise UserTaskError(f"{label}: reward_range must be a finite (min, max) pair with min < max.")
        reward_range = (low, high)

    if name is None:
        name = convention("NAME") or (
            Path(mod.__file__).stem if mod is not None and getattr(mod, "__file__", None) else "user_task"
        )
    doc = (mod.__doc__ or "").strip().splitlines() if mod is not None else []
    return _user_task_class()(
        name=str(name),
        title=str(title or convention("TITLE") or name),
        description=str(description or convention("DESCRIPTION") or (doc[0] if doc else "")),
        num_agents=num_agents,
        formatters=tuple(resolved),
        reward_func=reward_func,
        reward_range=reward_range,
        reward_processor=processor,
        train_data=tuple(train_items),
        eval_data=tuple(eval_items),
        source=label,
    )


def _source_label(source: Any) -> str | None:
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else None


@dataclass(frozen=True)
class UserTaskSpec:
    """A user task named by strings only, as the workbench and config files store it.

    ``module`` is a dotted module name or ``.py`` path; without it the module of ``reward`` (an import path)
    supplies the conventions. ``formatters`` is one import path or one per agent; attribute names without a
    colon are looked up in the module.
    """

    module: str | None = None
    reward: str | None = None
    formatters: str | tuple[str, ...] | None = None
    reward_processor: str | None = None
    data_path: str | None = None
    eval_data_path: str | None = None
    num_agents: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if not self.module and not self.reward:
            raise UserTaskError("a user task needs module or reward (e.g. 'my_task.py' or 'my_task.py:reward_func')")
        if self.reward and not self.module and ":" not in self.reward:
            raise UserTaskError(f"reward {self.reward!r} needs a module: use 'module:attribute' or 'file.py:attribute'")
        if isinstance(self.formatters, list):
            object.__setattr__(self, "formatters", tuple(self.formatters))
        if self.num_agents is not None and (isinstance(self.num_agents, bool) or self.num_agents < 1):
            raise UserTaskError(f"num_agents must be a positive integer, got {self.num_agents!r}")

    def build(self) -> Any:
        """Import the code, read the data and return the ``UserTask``."""
        module = self.module or self.reward.rpartition(":")[0]  # type: ignore[union-attr]
        formatters: Any = list(self.formatters) if isinstance(self.formatters, tuple) else self.formatters
        return load_user_task(
            module,
            data=self.data_path,
            eval_data=self.eval_data_path,
            reward=self.reward,
            formatters=formatters,
            reward_processor=self.reward_processor,
            num_agents=self.num_agents,
            name=self.name,
        )

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if isinstance(out["formatters"], tuple):
            out["formatters"] = list(out["formatters"])
        return out

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> UserTaskSpec:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(payload) - known)
        if unknown:
            raise UserTaskError(f"unknown user task fields {unknown}; expected some of {sorted(known)}")
        values = dict(payload)
        if isinstance(values.get("formatters"), Sequence) and not isinstance(values["formatters"], str):
            values["formatters"] = tuple(values["formatters"])
        return cls(**values)
