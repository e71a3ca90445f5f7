"""Run an LMCache module as a program with tutti's GDS backend installed:

    python -m tutti.lmcache [--runtime rt.yaml] <lmcache module> [its arguments...]
    python -m tutti.lmcache --runtime rt.yaml lmcache.v1.multiprocess.http_server \\
        --gds-l1-path tutti://kv --gds-l1-backend tutti --l1-size-gb 8 ...

LMCache builds its ``--gds-l1-backend`` choices from the backend modules it
finds when its argument parser is made, so ``tutti.lmcache.install()`` must
run first in the server's process; this wrapper does that, sets
``$TUTTI_CONFIG`` from ``--runtime`` when given, then runs the module as
``__main__`` (``runpy``) with the remaining arguments.
"""

from __future__ import annotations

import os
import runpy
import sys

import tutti.lmcache as tl


def main(argv: list) -> None:
    args = list(argv)
    if len(args) >= 2 and args[0] == "--runtime":
        os.environ[tl.CONFIG_ENV] = args[1]
        args = args[2:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    tl.install()
    sys.argv = args
    runpy.run_module(args[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
