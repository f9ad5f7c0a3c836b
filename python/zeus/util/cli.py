"""How every console entry point fails: one line saying what is wrong, one saying what to do.

Expected errors (no GPU library, a missing optional dependency, a bad path or number, a GPU
without a feature) print `PROG: error: ...` and `PROG: hint: ...` on stderr and exit 1 (2 for a
bad argument), without a traceback. `--debug` anywhere on the command line, or
`ZEUS_LOG_LEVEL=DEBUG`, shows the traceback instead. Unexpected errors keep theirs.

Every `Parser` (not its subcommands' parsers) takes `--version`, which prints
`PROG VERSION` (`version_line`) and exits 0.

Example:
    >>> def main(argv=None) -> int:
    ...     return run("python -m zeus.thing", _main, argv)  # doctest: +SKIP

"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from typing import Any, Callable, NoReturn, Sequence

from zeus import __version__
from zeus.exception import ZeusBaseError

# Top-level modules of optional dependencies, and the extra that installs each.
EXTRAS = {
    "uvicorn": "bso-server",
    "fastapi": "bso-server",
    "sqlalchemy": "bso-server",
    "alembic": "bso-server",
    "asyncpg": "bso-server",
    "aiosqlite": "bso-server",
    "pydantic_settings": "bso-server",
    "httpx": "bso",
    "transformers": "hf",
    "torch": "torch",
    "matplotlib": "plot",
}


class CliError(Exception):
    """An expected failure with a message and a hint; `status` 2 means a bad argument."""

    def __init__(self, message: str, hint: str = "", status: int = 1) -> None:
        """Say what is wrong and what to do."""
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.status = status


def version_line(prog: str) -> str:
    """What `PROG --version` prints: the command as it is typed, then zeus's version."""
    return f"{prog} {__version__}"


class Parser(argparse.ArgumentParser):
    """`argparse` with the same one-line error and hint as `run`, and `--version`.

    The parsers of subcommands (`add_subparsers().add_parser`) have no `--version`: it belongs
    to the command, `PROG --version`.
    """

    def __init__(self, *args: Any, version: bool = True, **kwargs: Any) -> None:
        """Make the parser; `version=False` leaves out the `--version` option."""
        super().__init__(*args, **kwargs)
        if version:
            self.add_argument(
                "--version",
                action="version",
                version=version_line(self.prog),
                help="print the command and zeus's version, and exit",
            )

    def add_subparsers(self, **kwargs: Any) -> Any:  # noqa: D102
        kwargs.setdefault("parser_class", partial(type(self), version=False))
        return super().add_subparsers(**kwargs)

    def error(self, message: str) -> NoReturn:  # noqa: D102
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        print(f"{self.prog}: hint: see {self.prog} --help", file=sys.stderr)
        raise SystemExit(2)


def port(value: str) -> int:
    """`argparse` type of a TCP port: 1 to 65535."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value!r}") from None
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"port must be from 1 to 65535, got {n}")
    return n


def host(value: str) -> str:
    """`argparse` type of an address to bind: an IP address or a name that resolves."""
    import socket

    try:
        socket.getaddrinfo(value, None)
    except (socket.gaierror, UnicodeError):
        raise argparse.ArgumentTypeError(
            f"not an address this machine can bind: {value!r}"
        ) from None
    return value


def positive_float(value: str) -> float:
    """`argparse` type of a finite number > 0."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not (x > 0 and x != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value}")
    return x


def server_parser(
    prog: str,
    description: str,
    settings: Callable[[], type],
    prefix: str,
    extra: str,
    default_port: int,
) -> Parser:
    """The parser of a server's console script, with `--host` and `--port` checked.

    Its epilog lists the settings class's environment variables. `settings` imports the
    pydantic-settings class; without the server's extra the epilog says which extra to install.
    """
    try:
        epilog = settings_help(settings(), prefix)
    except ModuleNotFoundError:
        epilog = f"settings: install the {extra!r} extra to list them"
    p = Parser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--host", type=host, default="127.0.0.1", help="address to bind (default 127.0.0.1)"
    )
    p.add_argument("--port", type=port, default=default_port, help=f"port (default {default_port})")
    return p


def settings_help(settings: type, prefix: str) -> str:
    """`--help` epilog listing a pydantic-settings class's environment variables and defaults."""
    fields = getattr(settings, "model_fields", {})
    lines = ["settings (environment variables, default in brackets):"]
    for name, field in fields.items():
        default = field.get_default(call_default_factory=True)
        lines.append(f"  {prefix}{name.upper()} [{default!r}]")
    return "\n".join(lines)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def describe(error: BaseException, extra: str | None = None) -> CliError | None:
    """The one-line message and hint for an expected error; `None` for an unexpected one.

    `extra` names the extra that the entry point itself needs, for missing modules that are
    not in `EXTRAS`.
    """
    if isinstance(error, CliError):
        return error
    if isinstance(error, ModuleNotFoundError) and error.name:
        root = error.name.split(".")[0]
        needed = extra if (extra and root in EXTRAS) else EXTRAS.get(root)
        if needed is None:
            return None
        return CliError(
            f"the Python package {root!r} is not installed",
            f"install the {needed!r} extra: pip install 'zeus-energy[{needed}]' "
            f"(from a clone: pip install '.[{needed}]')",
        )
    # zeus's own errors say what a user should do about them (the GPU errors in
    # `zeus.device.exception`), so this module needs no import of the layers above it.
    if isinstance(error, ZeusBaseError) and error.cli_hint is not None:
        return CliError(error.cli_summary or _one_line(error), error.cli_hint)
    if isinstance(error, OSError) and error.filename is not None:
        return CliError(
            f"{error.filename}: {error.strerror or _one_line(error)}",
            "check the path and its permissions",
        )
    if isinstance(error, ValueError):
        errors = getattr(error, "errors", None)
        if callable(errors):  # a pydantic ValidationError: name the first field
            first = errors()[0]
            loc = ".".join(str(p) for p in first.get("loc", ())) or "value"
            return CliError(f"{loc}: {first.get('msg')}", "see --help for the settings")
        return CliError(_one_line(error), "see --help", status=2)
    return None


def _debugging(argv: list[str]) -> bool:
    level = os.environ.get("ZEUS_LOG_LEVEL", "").strip().upper()
    return "--debug" in argv or level == "DEBUG"


def run(
    prog: str,
    main: Callable[[list[str]], int | None],
    argv: Sequence[str] | None = None,
    extra: str | None = None,
) -> int:
    """Run `main(argv)` as the console entry point `prog`; returns the exit status.

    `--debug` is taken out of `argv` (it works on every entry point) and makes expected errors
    show their traceback.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = _debugging(args)
    args = [a for a in args if a != "--debug"]
    try:
        return main(args) or 0
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep the interpreter from
        # complaining when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except Exception as e:
        if debug:
            raise
        known = describe(e, extra)
        if known is None:
            raise
        print(f"{prog}: error: {known.message}", file=sys.stderr)
        if known.hint:
            print(f"{prog}: hint: {known.hint}", file=sys.stderr)
        return known.status
