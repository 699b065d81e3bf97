"""``python -m hetmm_ray.cli``: the ``hetmm`` command without its installed script (tests run it so,
in a fresh process)."""

from __future__ import annotations

import sys

from . import main

if __name__ == "__main__":  # not on import: tests import every module of the package (pkgutil.walk_packages)
    sys.exit(main())
