"""The swcli command line's entry point: main(argv), signals, exit codes, one-line errors.

main installs the signal handler (swcli.interrupt) before anything heavy is imported, typer included
(the commands are in commands.py): a Ctrl-C or SIGTERM at any moment ends the run with status 130,
the line `swcli: interrupted`, no traceback and no partial output file. Exit codes: 0 ok, 1 bad data or
a runtime error, 2 a command line that does not parse (unknown option, out-of-range value), 130
interrupted, 141 the reader of stdout went away. Errors are one line on stderr. `swcli` alone prints
the help and exits 0; `swcli --version` prints `swcli 0.1.0`. Neither imports torch.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Optional

from swcli import interrupt, launch

INTERRUPTED = interrupt.STATUS  # 128 + SIGINT, as a shell reports a process stopped by Ctrl-C


def _error_types(typer):
    """click's exception classes as typer exposes them (typer vendors click in recent versions)."""
    by_name = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
    return by_name["UsageError"], by_name["ClickException"]


def _distributed():
    """swcli.distributed where a command loaded it (it imports torch), else None."""
    return sys.modules.get("swcli.distributed")


def _command(app, argv: list[str]):
    """The command's exit code; a distributed run's rank then marks the command's end, and reports to
    the others an error that its exchanges did not carry (distributed.finish)."""
    try:
        code = app(args=argv, prog_name="swcli", standalone_mode=False)
    except BaseException as exc:
        distributed = _distributed()
        instead = exc if distributed is None else distributed.finish(exc)
        if instead is exc:
            raise
        raise instead from exc
    if _distributed() is not None:
        _distributed().finish(None)
    return code


def _run(argv: list[str]) -> int:
    import typer

    from swcli.commands import app
    from swcli.errors import SwcliError

    usage_error, click_error = _error_types(typer)
    if not argv:  # bare `swcli`: the help on stdout, exit 0 (as `cargo` or `docker` do)
        argv = ["--help"]
    try:
        from swcli._build import BuildError

        code = _command(app, argv)
        if code == INTERRUPTED:  # typer turns KeyboardInterrupt into a silent exit code 130
            print("swcli: interrupted", file=sys.stderr)
        return code if isinstance(code, int) else 0
    except usage_error as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        if not launch.silent_rank():  # torchrun's ranks share one command line: rank 0 says it
            print(f"swcli: usage error: {exc.format_message()}{hint}", file=sys.stderr)
        return 2
    except click_error as exc:
        print(f"swcli: error: {exc.format_message()}", file=sys.stderr)
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        print("swcli: interrupted", file=sys.stderr)
        return INTERRUPTED
    except (SwcliError, BuildError) as exc:
        if getattr(exc, "shown", True):  # distributed.RankFailed: shown by rank 0 alone
            if _distributed() is not None:
                _distributed().before_saying()
            print(f"swcli: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 1)
    except BrokenPipeError:  # the version into `| head -c0`: as the commands' output does
        return _reader_gone()
    except SystemExit as exc:
        # click answers a broken pipe under its help with exit 1 and stdout wrapped to stay quiet
        if exc.code == 1 and type(sys.stdout).__name__ == "PacifyFlushWrapper":
            return _reader_gone()
        raise
    except OSError as exc:
        if exc.filename is not None:  # a file's error no command turned into its own line: unexpected
            raise
        # what is left writes stdout: the help, the version (the commands' rows say so themselves)
        print(f"swcli: error: stdout: cannot write output ({exc.strerror or exc})", file=sys.stderr)
        return 1
    except MemoryError:
        print("swcli: error: out of memory (a smaller --chunk-size, or a record too long for this machine)",
              file=sys.stderr)
        return 1


def _reader_gone() -> int:
    """141, as a shell reports a process stopped by SIGPIPE; stdout then points at /dev/null so that the
    interpreter's last flush does not print a second error."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141


def _left_broken() -> bool:
    distributed = _distributed()
    return distributed is not None and distributed.left_broken()


def main(argv: Optional[list[str]] = None) -> int:
    """Run the CLI; returns the exit code (the console script passes it to sys.exit).

    argv None means this is the process (the console script, `python -m swcli`): the signal handler
    then stays in place to the end, and where a scoring thread is still inside an engine call (an error
    cut its chunk short), or a distributed run's group broke (its threads may wait for a peer that is
    gone), the process leaves through os._exit rather than wait. With argv (the tests, in-process) the
    previous handlers are put back and the code is returned.
    """
    process = argv is None
    if sys.stderr is None:  # started with stderr closed (2>&-): its messages go nowhere, as asked
        sys.stderr = open(os.devnull, "w")
    previous = interrupt.install()
    try:
        code = _run(sys.argv[1:] if process else list(argv))
    except BaseException:
        if not (process and _left_broken()):
            raise
        traceback.print_exc()  # what the interpreter prints of an error no one expected, before os._exit
        code = 1
    finally:
        if not process:
            interrupt.restore(previous)
    pipeline = sys.modules.get("swcli.pipeline")
    if process and (_left_broken() or pipeline is not None and pipeline.scoring_in_progress()):
        if _distributed() is not None:
            _distributed().leave()  # what atexit would do, but for the group's threads
        with interrupt.protected():
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
        os._exit(code)
    return code
