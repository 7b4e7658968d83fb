"""`--callback SPEC`: a user's callback class named as `path/to/file.py:Class` or
`package.module:Class`, loaded and made (without arguments) by each process that runs it."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from nlptrain.errors import ConfigError


def check_file(spec: str) -> None:
    """Before `--nproc` starts workers (each loads the file): that a FILE.py spec's file exists
    and compiles (run, it would import torch in the launcher: the workers run it)."""
    where = spec.rpartition(":")[0]
    if where.endswith(".py") and not Path(where).is_file():
        raise ConfigError(f"--callback {spec}: file {where} not found")
    if where.endswith(".py"):
        try:
            compile(Path(where).read_bytes(), where, "exec")
        except (SyntaxError, ValueError) as err:
            raise _said_at_its_line(err, where, spec) from None


def make_callback(spec: str) -> Any:
    """`--callback FILE.py:Class`: an instance of the class, made without arguments and checked
    (`events.check_callback`), every error naming the spec."""
    from nlptrain.events import Callback, check_callback
    from nlptrain.logs import heed_log_level

    made = load_object(spec)
    where = spec.rpartition(":")[0]  # its logger's info shows, as ours; a file's by its name
    heed_log_level(getattr(made, "__module__", "") or "", Path(where).name if where.endswith(".py") else "")
    if not isinstance(made, type):  # an instance, a function, a constant: nothing to make
        raise ConfigError(f"--callback {spec}: names {_what(made)}, not a class: name the "
                          "Callback class itself (it is made without arguments)")
    if not issubclass(made, Callback):
        raise ConfigError(f"--callback {spec}: {made.__name__} is not a Callback: subclass "
                          "nlptrain.Callback and override the events you need")
    try:
        inspect.signature(made).bind()
    except TypeError as err:
        raise ConfigError(f"--callback {spec}: {err}; a --callback class is made without "
                          "arguments: give its parameters defaults (or read them from the "
                          "environment)") from None
    except ValueError:  # no signature to read
        pass
    try:
        return check_callback(made())
    except ConfigError as err:
        raise ConfigError(f"--callback {spec}: {err}") from None
    except Exception as err:  # its __init__ failed (a setting read from the environment, say)
        try:
            file = inspect.getsourcefile(made) or where
        except TypeError:
            file = where
        raise _failed_in(err, Path(file), spec) from err


def _what(found: Any) -> str:
    if inspect.isroutine(found):
        return f"the function {getattr(found, '__name__', found)!r}"
    if isinstance(found, (int, float, str, bytes)):
        return f"the value {found!r}"
    return f"a {type(found).__name__} instance"


def load_object(spec: str) -> Any:
    """`package.module:Name` or `path/to/file.py:Name`."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"--callback {spec}: expected MODULE:CLASS or FILE.py:CLASS")
    if ".py:" in where:  # FILE.py:Class:3: the class is made without arguments
        raise ConfigError(f"--callback {spec}: expected FILE.py:CLASS or MODULE:CLASS, with no "
                          "arguments (the class is made without any: give its parameters defaults)")
    try:
        module = _run_file(Path(where), spec) if where.endswith(".py") else importlib.import_module(where)
        if not hasattr(module, name):  # (a file's module has a name of nlptrain's own)
            raise ConfigError(f"--callback {spec}: {where} defines no {name!r}")
        return getattr(module, name)
    except (SyntaxError, ValueError) as err:  # the user's file: its line, not our traceback
        raise _said_at_its_line(err, where, spec) from None
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"--callback {spec}: cannot load it ({err})") from None


def _said_at_its_line(err: SyntaxError | ValueError, where: str, spec: str) -> ConfigError:
    place = f"{getattr(err, 'filename', None) or where}" + \
        (f":{err.lineno}" if getattr(err, "lineno", None) else "")  # (a NUL byte has no line)
    return ConfigError(f"{place}: {getattr(err, 'msg', err)} (--callback {spec})")


def _run_file(path: Path, spec: str) -> Any:
    """The file's module, run from the bytes read now (not a bytecode cache a rewrite within the
    same second may leave stale), once for those bytes: a file named twice runs once, as an import."""
    try:
        source = path.read_bytes()
    except OSError:
        raise ConfigError(f"--callback {spec}: file {path} not found") from None
    digest = hashlib.blake2b(f"{path.resolve()}".encode() + source, digest_size=8).hexdigest()
    # Registered under a name of its own: a dataclass, pickle or typing looks the module up in
    # sys.modules by the class's __module__ (a dot in it would name a package).
    module_name = f"nlptrain_callback_{re.sub(r'[^0-9A-Za-z_]', '_', path.stem)}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    code = compile(source, str(path), "exec")
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(module_name, path))
    _import_beside(path)
    sys.modules[module_name] = module
    try:
        exec(code, module.__dict__)
    except Exception as err:  # the user's code failed: its line, as for a syntax error
        del sys.modules[module_name]
        raise _failed_in(err, path, spec) from err
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _failed_in(err: Exception, path: Path, spec: str) -> ConfigError:
    """An error of the user's code, at its line in `path` (the deepest there), in one line."""
    lines = [f":{f.lineno}" for f in traceback.extract_tb(err.__traceback__)
             if Path(f.filename).resolve() == path.resolve()] or [""]
    return ConfigError(f"{path}{lines[-1]}: {type(err).__name__}: {err} (--callback {spec})")


def _import_beside(path: Path) -> None:
    """The file's folder is importable, as for `python FILE.py` (its helper modules beside it);
    last on the path, so a file there never shadows an installed package."""
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)


def absolute_spec(spec: str) -> str:
    """A `FILE.py:Class` spec with the file's absolute path (a resume may start elsewhere)."""
    where, sep, name = spec.rpartition(":")
    return f"{Path(where).resolve()}{sep}{name}" if where.endswith(".py") else spec
