"""How the command line's mistakes are told: argparse's one-line usage error (exit 2), from the
command's own parser, naming the nearest option or the `--set` form of a task key."""

from __future__ import annotations

import argparse
import difflib
import re
from typing import Any


class CommandParser(argparse.ArgumentParser):
    """A command's parser: a misspelt option is named before a required one it leaves missing
    (`eval --modle m` said only that --model is required)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A value in exponent form is a number too (`--lr -1e-5`, as `--lr -1` and `--lr -0.5`):
        # Python before 3.13 took it for an option, and said --lr expected one argument.
        self._negative_number_matcher = re.compile(r"^-\d*\.?\d+(e[-+]?\d+)?$", re.IGNORECASE)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._given = list(args or [])  # (a command's parser is always given its own tokens)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):  # type: ignore[override]
        unknown = unknown_options(self, getattr(self, "_given", []))
        if message.startswith("the following arguments are required") and unknown:
            refuse_unknown(self, self.prog.split()[-1], unknown)
        super().error(message)


def options_of(parser: argparse.ArgumentParser) -> list[str]:
    return [flag for action in parser._actions for flag in action.option_strings]


def unknown_options(parser: argparse.ArgumentParser, tokens: list[str]) -> list[str]:
    """The tokens from the first option the parser does not know (nor abbreviates), and its
    value if one follows."""
    known = options_of(parser)
    for at, token in enumerate(tokens):
        flag = token.split("=")[0]
        if _is_option(token) and not any(option.startswith(flag) for option in known):
            with_value = at + 1 < len(tokens) and not tokens[at + 1].startswith("-")
            return tokens[at:at + 2] if with_value and "=" not in token else [token]
    return []


def _is_option(token: str) -> bool:
    """--name or -x, not a value such as -5 or -1e-3 (nor a lone -, stdin)."""
    try:
        float(token)
    except ValueError:
        return token.startswith("-") and len(token) > 1
    return False


def refuse_options_before_command(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """`nlptrain --log-level debug train`: the command's options go after it (argparse took
    'debug' for the command and listed the commands)."""
    commands = parser.get_default("commands")
    at = next((i for i, token in enumerate(argv) if token in commands), 0)
    top = options_of(parser)
    early = [token for token in argv[:at]
             if token.startswith("-") and token.split("=")[0] not in top]
    if not early:
        return
    command = commands[argv[at]]
    unknown = unknown_options(command, argv[:at])  # (not the command's either: its nearest)
    if unknown:
        refuse_unknown(command, argv[at], unknown)
    if early:
        fixed = " ".join([argv[at], *argv[:at], *argv[at + 1:]])
        parser.error(f"{early[0].split('=')[0]} is an option of the command and goes after it: "
                     f"nlptrain {fixed}")


def refuse_unknown(command: argparse.ArgumentParser, name: str, unknown: list[str]) -> None:
    """Exit 2 with the command's usage (not the top level's) and the nearest option's name."""
    from nlptrain.task_options import NOT_ON_COMMAND_LINE, task_key_of

    options = options_of(command)
    flag = unknown[0].split("=")[0]
    near = difflib.get_close_matches(flag, options, n=1)
    keys = [(section, key) for section, key in NOT_ON_COMMAND_LINE
            if flag == f"--{key.replace('_', '-')}" and "--set" in options]  # (predict has none)
    task_key = task_key_of(flag) if "--set" in options else None  # eval: a key of train's
    if keys:
        hint = f" (a list, set in the task file or as --set {keys[0][0]}.{keys[0][1]}='[\"a\", \"b\"]')"
    elif task_key:
        key, value = task_key  # value: 'true'/'false' for a boolean's flags, else ''
        typed = unknown[0].partition("=")[2]  # (--no-x=... means false, whatever is typed)
        if value != "false":
            value = typed or value or \
                (unknown[1] if len(unknown) > 1 and not unknown[1].startswith("-") else "VALUE")
        hint = f" ({name} takes this task key as --set {key}={value})"
    else:
        hint = f" (did you mean {near[0]}?)" if near else ""
    command.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
