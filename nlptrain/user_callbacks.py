"""`--callback SPEC`: a user's callback class named as `path/to/file.py:Class` or
`package.module:Class`, loaded and made (without arguments) by each process that runs it."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any

from nlptrain.errors import ConfigError


def check_file(spec: str) -> None:
    """Before `--nproc` starts workers (each loads the file): that a FILE.py spec's file exists."""
    where = spec.rpartition(":")[0]
    if where.endswith(".py") and not Path(where).is_file():
        raise ConfigError(f"--callback {spec}: file {where} not found")


def make_callback(spec: str) -> Any:
    """`--callback FILE.py:Class`: an instance of the class, made without arguments."""
    made = load_object(spec)
    try:
        inspect.signature(made).bind()
    except TypeError as err:
        raise ConfigError(f"--callback {spec}: {err}; a --callback class is made without "
                          "arguments: give its parameters defaults (or read them from the "
                          "environment)") from None
    except ValueError:  # no signature to read
        pass
    return made()


def load_object(spec: str) -> Any:
    """`package.module:Name` or `path/to/file.py:Name`."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise ConfigError(f"--callback {spec}: expected MODULE:CLASS or FILE.py:CLASS")
    try:
        if where.endswith(".py"):
            path = Path(where)
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            if module_spec is None or not path.is_file():
                raise ConfigError(f"--callback {spec}: file {where} not found")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        return getattr(module, name)
    except SyntaxError as err:  # the user's file: its line, not our traceback
        raise ConfigError(f"{err.filename}:{err.lineno}: {err.msg} (--callback {spec})") from None
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"--callback {spec}: cannot load it ({err})") from None


def absolute_spec(spec: str) -> str:
    """A `FILE.py:Class` spec with the file's absolute path (a resume may start elsewhere)."""
    where, sep, name = spec.rpartition(":")
    return f"{Path(where).resolve()}{sep}{name}" if where.endswith(".py") else spec
