"""The ``recformer`` command.

- ``recformer fit|validate|test|predict ...``: LightningCLI (``recformer.cli``).
- ``recformer data movielens|synth|embed-items|summary|vocab|build|checksum ...``: dataset preparation.
- ``recformer evaluate --ckpt ... --data ...``: offline exact metrics.
- ``recformer doctor RUN_DIR``: reads a run's internal metrics and names its failure.
- ``recformer serve EXPORT_DIR``: an exported ranker behind an HTTP server (``recformer.serve``).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import linecache
import os
import sys

from recformer.version import version

# Each data command lives in its own module exposing ``register(subparsers)``; imports stay lazy so
# ``recformer data ...`` does not pay for torch/Lightning start-up.
DATA_COMMANDS = {
    "movielens": "recformer.datasets.movielens",
    "synth": "recformer.datasets.synth",
    "embed-items": "recformer.datasets.embed_items",
    "summary": "recformer.datasets.summary",
    "vocab": "recformer.datasets.vocab",
    "build": "recformer.datasets.build",
    "checksum": "recformer.datasets.checksum",
}


def data_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="recformer data", description="Prepare Parquet logs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(DATA_COMMANDS) + "}")
    wanted = argv[0] if argv and argv[0] in DATA_COMMANDS else None
    for name, module in DATA_COMMANDS.items():
        if wanted is None or name == wanted:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


USAGE = """usage: recformer {fit,validate,test,predict,data,evaluate,doctor,lab,export,serve} ...
       recformer --version

  fit, validate, test, predict  a ranker through LightningCLI (e.g. recformer fit --help)
  data                          prepare Parquet logs: movielens, synth, embed-items, summary, vocab, build,
                                checksum
  evaluate                      offline exact metrics of a checkpoint on a split
  doctor                        read a run's internal metrics and name its failure
  lab                           scaling-lab grids of runs: list, run GRID, report DIR
  export                        a checkpoint as a torch.export / ONNX artifact for serving
  serve                         an exported ranker behind an HTTP server: raw features in, scores out
"""


COMMANDS = ("fit", "validate", "test", "predict", "data", "evaluate", "doctor", "lab", "export", "serve")


def main(argv: list[str] | None = None) -> int:
    from recformer.lifeline import bind_to_parent

    bind_to_parent()  # started by `recformer lab run`: die with it
    argv = list(sys.argv[1:] if argv is None else argv)
    # LightningCLI's own top-level help knows only its four subcommands.
    if not argv:
        print(USAGE, end="", file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"recformer {version()}")
        return 0
    if argv[0] not in COMMANDS and not argv[0].startswith("-"):  # options go to LightningCLI
        print(USAGE, end="", file=sys.stderr)
        print(
            f"recformer: error: unknown command {argv[0]!r}; expected one of {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    if argv[0] == "data":
        return data_main(argv[1:])
    if argv[0] in TOOLS:
        return int(importlib.import_module(TOOLS[argv[0]]).main(argv[1:]) or 0)
    if argv[0] == "lab":
        from recformer.lab import main as lab_main

        try:
            return lab_main(argv[1:])
        except (FileNotFoundError, ValueError) as e:  # a bad grid name, file or setting
            if _traceback_wanted():
                raise
            return _one_line("recformer lab", str(e))
    return lightning_main(argv, argv == sys.argv[1:])


TOOLS = {
    "evaluate": "recformer.evaluate",
    "export": "recformer.export",
    "doctor": "recformer.doctor",
    "serve": "recformer.serve.server",
}
"""Commands with a ``main(argv)`` of their own, imported when called (torch, LitServe start slowly)."""


def lightning_main(argv: list[str], from_command_line: bool) -> int:
    """``recformer fit|validate|test|predict``: LightningCLI, its stops said in one line each."""
    from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

    from recformer.callbacks.preemption import EXIT_SIGTERM
    from recformer.cli import cli_main

    command = f"recformer {argv[0]}"
    try:
        cli_main(None if from_command_line else argv)
    except SIGTERMException as e:  # a SystemExit without a code: the process would exit 0
        saved = getattr(e, "checkpoint", None)
        where = (
            f"at step {e.step}; the state is in {saved} (resume: --ckpt_path {saved})"
            if saved is not None
            else "(no recformer.callbacks.preemption.SaveOnSigterm callback: nothing saved)"
        )
        from lightning.pytorch.utilities import rank_zero_only

        if getattr(rank_zero_only, "rank", 0) == 0:  # every DDP rank stops; one line says so
            print(f"{command}: stopped by SIGTERM {where}", file=sys.stderr)
        return EXIT_SIGTERM
    except (FileNotFoundError, ValueError, MisconfigurationException) as e:  # DataError is a ValueError
        named = _check_behind(e)
        if _traceback_wanted() or not _deliberate(named):
            raise
        # A bad setting, path or input file: its message names it. A traceback on top hides that
        # line under fifty others; RECFORMER_TRACEBACK=1 brings it back.
        return _one_line(command, str(named), getattr(e, "resume_hint", None))
    except OSError as e:
        if _traceback_wanted() or e.errno not in _ENVIRONMENT_ERRNOS:
            raise
        run_dir = getattr(e, "run_dir", None)
        where = e.filename or (f"in the run folder {run_dir}" if run_dir is not None else "a file")
        said = f"cannot write {where}: {e.strerror}"
        return _one_line(command, said, getattr(e, "resume_hint", None))
    return 0


_ENVIRONMENT_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}
"""OS errors that are about the machine (permissions, read-only or full disks), not a bug."""


def _traceback_wanted() -> bool:
    return os.environ.get("RECFORMER_TRACEBACK", "0") not in ("", "0")


def _one_line(command: str, message: str, hint: str | None = None) -> int:
    """The error, and for a fit that saved a checkpoint where it resumes (``recformer.resume``)."""
    said = f"{message.rstrip().rstrip('.')}; {hint}" if hint else message
    print(f"{command}: error: {said}", file=sys.stderr)
    print("(the traceback: RECFORMER_TRACEBACK=1)", file=sys.stderr)
    return 2


CONFIG_SECTIONS = {"RankerConfig": "model.ranker", "OptimConfig": "model.optim"}
"""Where a config dataclass sits in the CLI's settings, to name a setting its check refuses."""


def _check_behind(e: BaseException) -> BaseException:
    """The check behind a jsonargparse error: a config's ``__post_init__`` refusing a value reaches
    the user wrapped in jsonargparse's parse error and the value's repr (several lines); the
    check's own sentence, with its section (``model.optim: eps=0.0 must be > 0``), is the useful line."""
    chain, inner = [e], e
    while inner.__cause__ or inner.__context__:
        inner = inner.__cause__ or inner.__context__
        chain.append(inner)
    for inner in chain:  # the error itself (a config built at instantiation), or one it wraps
        tb = inner.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is not None and tb.tb_frame.f_code.co_name == "__post_init__" and isinstance(inner, ValueError):
            section = CONFIG_SECTIONS.get(type(tb.tb_frame.f_locals.get("self")).__name__)
            if section is not None:
                named = ValueError(f"{section}: {inner}")
                return named.with_traceback(inner.__traceback__)
    return e


def _deliberate(e: BaseException) -> bool:
    """Raised by a ``raise`` statement with a message (a check saying what is wrong), not by
    Python or a library failing mid-expression (``a, b = x``, ``int("")``: a bug, whose traceback
    is the useful part)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None or not str(e):
        return False
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip()
    return line.startswith("raise ")


if __name__ == "__main__":
    sys.exit(main())
