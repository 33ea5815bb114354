"""The ``sparse2d`` command: ``sparse2d config ...`` and ``sparse2d train ...``.

``sparse2d train --config C [overrides]`` is ``python -m sparse2d.train`` (run it under
torchrun for more than one process: see ``launch/``); ``sparse2d config --reference``
prints the configuration reference, ``sparse2d config --check C [--world-size N]``
validates a config; ``sparse2d report RUN_DIR [RUN_DIR ...] [-o out.png]`` compares
runs (a table and loss / AUC / samples/s curves); ``sparse2d plan`` is the group-size
advisor; ``sparse2d dryrun --config C --world-size N [--rank r]`` builds one rank of an
``N``-rank job on torch's fake process group and describes it (``sparse2d.train.dryrun``).
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
