"""How the packages whose every file is an entry (pushpull.policy: strategies; pushpull.compression:
codecs) find their files: every module of the package's path, and of any other directory with the same
package path (``pushpull/policy``, ``pushpull/compression``) on ``sys.path``, so an entry kept next to a
training script is found by every process that has its directory on the path, servers included."""
from __future__ import annotations

import importlib
import os
import pkgutil
import sys


def extend_package_path(path: list, package: str) -> None:
    """Append to ``path`` (a package's ``__path__``) every ``<sys.path entry>/<package as folders>``."""
    rel = os.path.join(*package.split("."))
    seen = {os.path.realpath(p) for p in path}
    for entry in sys.path:
        d = os.path.join(entry or os.getcwd(), rel)
        if os.path.isdir(d) and os.path.realpath(d) not in seen:
            path.append(d)
            seen.add(os.path.realpath(d))


def import_all(path: list, package: str, skip: tuple[str, ...] = ()) -> list:
    """Import every module of ``package`` found on ``path`` (names starting with _ and ``skip`` aside)."""
    return [importlib.import_module(f"{package}.{info.name}") for info in pkgutil.iter_modules(path)
            if not info.name.startswith("_") and info.name not in skip]
