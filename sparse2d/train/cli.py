"""The ``sparse2d`` command: ``train``, ``config``, ``report``, ``plan`` and ``dryrun``.

``sparse2d train`` is ``python -m sparse2d.train`` (under torchrun for more than one process:
``launch/``); the others are single-process tools (``sparse2d --help``).
"""

from __future__ import annotations

import sys

COMMANDS = {
    "config": "sparse2d.train.config",
    "dryrun": "sparse2d.train.dryrun",
    "plan": "sparse2d.train.advisor_command",
    "report": "sparse2d.train.report",
    "train": "sparse2d.train.main",
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        names = ", ".join(COMMANDS)
        print(f"usage: sparse2d {{{names}}} [args...]  (sparse2d COMMAND --help)", file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    import importlib

    module = importlib.import_module(COMMANDS[args[0]])
    return int(module.main(args[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
