"""The ``pushpull`` command: one entry point, one sub-command per tool.

Sub-commands are resolved lazily ("module:function") so that ``pushpull sim``
does not import torch or zmq, and each tool keeps its own argparse parser next
to its code. Each target is called with the remaining argv and returns an exit
code.
"""
from __future__ import annotations

import importlib
import re
import sys

# name -> (target "module:function", one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "launch": ("pushpull.launch.cli:main", "start scheduler, servers and workers (BytePS DMLC_* env honoured)"),
    "bench": ("pushpull.bench.cli:main", "benchmarks: allreduce, compression, scheduling, grid, report"),
    "profile": ("pushpull.bench.profile_cli:main", "measure a per-layer profile of a model on this hardware"),
    "sim": ("pushpull.sim.cli:sim_main", "predict iteration time of strategies on a cluster"),
    "plan": ("pushpull.sim.cli:plan_main", "recommend strategy, partition size and credit for a cluster"),
    "timeline": ("pushpull.timeline_cli:main", "summarize a Chrome-trace timeline written with PUSHPULL_TRACE_ON=1"),
    "cluster": ("pushpull.emulate.cli:main", "emulated cluster on network namespaces: check, measure, launch, "
                                             "torch, cleanup"),
    "config": ("pushpull.config:main", "print every setting, its environment variables and current value"),
    "top": ("pushpull.top:main", "a running job live in the terminal, from its Prometheus endpoints "
                                 "(PUSHPULL_METRICS_PORT)"),
}


def help_text(doc: str) -> str:
    """A docstring as --help prints it: reStructuredText's ``literals`` and :role:`targets` as plain text."""
    doc = re.sub(r"``([^`]+)``", r"\1", doc)
    return re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc)


def _usage() -> str:
    lines = ["usage: pushpull COMMAND [ARGS...]", "", "commands:"]
    for name, (_, help_) in COMMANDS.items():
        lines.append(f"  {name:<10} {help_}")
    lines.append("")
    lines.append("Run 'pushpull COMMAND --help' for the options of one command.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("--version", "version"):
        from pushpull import __version__

        print(__version__)
        return 0
    name = argv[0]
    if name not in COMMANDS:
        print(f"pushpull: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, func_name = COMMANDS[name][0].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    rc = func(argv[1:])
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
