"""The argument parsers' help and errors: help with every option's default and each command's
table of exit statuses; errors in one line that says what is wrong, the closest option or
command when a name is mistyped ("did you mean --spacing?"), and a short usage (the arguments
it needs, not every option; ``--help`` lists those)."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys

__all__ = [
    "HelpFormatter",
    "Parser",
    "did_you_mean",
    "exit_status",
    "EXIT_ALL",
    "EXIT_INSPECT",
    "EXIT_TRACE",
]


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Help with the default of every option (``none``/``off`` when unset) and the epilog
    kept as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (
            "(default" in text
            or action.default is argparse.SUPPRESS
            or not action.option_strings
            or action.required
        ):
            return text
        if action.default is None:
            return f"{text} (default: none)"
        if action.default is False:
            return f"{text} (default: off)"
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are short (its subcommands' parsers too)."""

    given: list = []  # the words this parser was given (for the hints)

    def parse_known_args(self, args=None, namespace=None):
        """As argparse's, remembering ``args`` (for the hints of :meth:`error`)."""
        self.given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        """Print the short usage and ``PROG: error: MESSAGE`` (with a suggestion), exit 2."""
        hint = did_you_mean(self, message) or _swallowed(self, message)
        self.exit(2, f"{self.short_usage()}{self.prog}: error: {message}{hint}\n")

    def short_usage(self) -> str:
        """The usage line of the positional arguments and the required options only."""
        needed = [a for a in self._actions if a.required or not a.option_strings]
        fmt = self._get_formatter()
        fmt.add_usage(self.usage, needed, [])
        more = len(needed) < len(self._actions)
        return (
            fmt.format_help().rstrip("\n")
            + (" [options]" if more else "")
            + (f"  ({self.prog} --help lists {'them' if more else 'the arguments'})\n")
        )


def did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """ "; did you mean X?" for the mistyped options or command named in an argparse error
    ``message`` (empty when nothing is close)."""
    choice = re.search(r"invalid choice: '?([^'\s]*)'? \(choose from", message)
    if choice:  # (the choices from the parser: how argparse quotes them varies by version)
        known = [str(c) for a in parser._actions if a.choices for c in a.choices]
        words = {choice.group(1): known}
    elif message.startswith("unrecognized arguments: "):
        options = list(parser._option_string_actions)  # (argparse keeps them there)
        given = message.removeprefix("unrecognized arguments: ").split()
        words = {w.split("=")[0]: options for w in given if w.startswith("-")}
    else:
        return ""
    hits = [difflib.get_close_matches(w, known, n=1, cutoff=0.6) for w, known in words.items()]
    hits = [h[0] for h in hits if h]
    return f"; did you mean {' or '.join(hits)}?" if hits else ""


def exit_status(
    ok: str,
    usage: str,
    failed: str | None = None,
    interrupted: str = "interrupted (Ctrl-C)",
    head: str = "exit status:",
    terminated: str | None = None,
) -> str:
    """A command's table of exit statuses (its ``--help`` epilog): what 0, 1, 2 and 130 mean
    for it, with what every command shares (1 also for a bug, 141); docs/cli.md has the
    table."""
    import textwrap

    bug = "an unexpected error (a bug: the message says to report it)"
    rows = [
        ("0", ok),
        ("1", f"{failed}; or {bug}" if failed else bug),
        ("2", usage),
        ("130", interrupted),
        ("141", "the reader of the output went away (a closed pipe)"),
    ] + ([("143", terminated)] if terminated else [])
    lines = [head]
    for code, text in rows:
        wrapped = textwrap.wrap(text, 82)
        lines += [f"  {code:5s}{wrapped[0]}"] + [f"       {w}" for w in wrapped[1:]]
    return "\n".join(lines)


def _swallowed(parser: argparse.ArgumentParser, message: str) -> str:
    """The hint for an option of several values (``--spacing 1.5 DIR``) that took the inputs
    after it: "invalid float value: 'DIR'" for a path, or INPUT missing while such an option
    was given."""
    given = set(getattr(parser, "given", ()))
    actions = {o: a for a in parser._actions for o in a.option_strings}
    value = re.search(r"invalid \w+ value: '([^']*)'", message)
    opt = re.search(r"argument ([-\w/]+):", message)
    action = actions.get(opt.group(1).split("/")[-1]) if opt else None
    if value and action is not None and os.path.exists(value.group(1)):
        name = action.option_strings[-1]
        if action.nargs in ("+", "*"):
            how = f"or write {name}=VALUE for one value"
        else:
            how = f"{name} takes {action.nargs} values"
        return f"; {value.group(1)!r} is a path: put the inputs before the options ({how})"
    several = [
        o for o, a in actions.items() if a.nargs in ("+", "*") and o.startswith("--") and o in given
    ]
    if "arguments are required: INPUT" in message and several:
        return (
            f"; {', '.join(several)} takes every word after it: put the inputs before the options"
        )
    return ""


#: the exit statuses ``medproc --help`` lists, and those of ``inspect`` and ``trace``
EXIT_ALL = exit_status(
    "everything worked",
    "the command could not start: bad arguments or inputs (the message says which)",
    "some cases or files failed",
    head="exit status (each command's --help says more):",
    terminated="terminated (SIGTERM; convert records its cases first, see convert --help)",
)
EXIT_INSPECT = exit_status(
    "every volume was read",
    "bad arguments, or a path that does not exist",
    "some series or files are in error (listed), or none was found",
)
EXIT_TRACE = exit_status("the report was printed", "no trace in DIR (or two runs in it)")
