"""The strategy registry: every module of this package that defines a :class:`~pushpull.policy.base.Policy`
subclass with a ``name`` is a strategy, found by scanning the package (``__path__``, and any other
``pushpull/policy`` directory on ``sys.path``: :mod:`pushpull.extend`), so adding one is adding a file.
The runtime, the simulator, the benchmark grid and the configuration read their names here.

Executors register themselves for a policy, as codecs do (``@register_executor("mgwfbp", "runtime")`` on
the class), so this package names none of them and imports nothing of pushpull.torch or pushpull.sim:
:func:`executor` imports the package of executors of that kind (:data:`EXECUTOR_PACKAGES`) when asked.
"""
from __future__ import annotations

import importlib

from pushpull.extend import extend_package_path, import_all
from pushpull.policy.base import ABSENT, OWN, Policy

extend_package_path(__path__, __name__)  # also pushpull/policy directories elsewhere on sys.path

_POLICIES: dict[str, type[Policy]] = {}
_ALIASES: dict[str, str] = {}
_scanned: tuple = ()


def _scan() -> None:
    global _scanned
    key = tuple(__path__)
    if key == _scanned:
        return
    found: dict[str, type[Policy]] = {}
    for mod in import_all(__path__, __name__, skip=("base",)):
        for obj in vars(mod).values():
            if (isinstance(obj, type) and issubclass(obj, Policy) and obj.__module__ == mod.__name__
                    and obj.name):
                other = found.get(obj.name)
                if other is not None and other is not obj:
                    raise ValueError(f"strategy name {obj.name!r} is defined by both {other.__module__} and "
                                     f"{obj.__module__}")
                found[obj.name] = obj
    _POLICIES.clear()
    _POLICIES.update(sorted(found.items(), key=lambda kv: (kv[1].order, kv[0])))
    _ALIASES.clear()
    for p in _POLICIES.values():
        for a in p.aliases:
            _ALIASES[a] = p.name
    _scanned = key


def refresh() -> None:
    """Scan again (after a directory was added to this package's ``__path__``)."""
    global _scanned
    _scanned = ()
    _scan()


def names() -> list[str]:
    """Every strategy's name, in listing order."""
    _scan()
    return list(_POLICIES)


def aliases() -> dict[str, str]:
    _scan()
    return dict(_ALIASES)


def get(name: str) -> type[Policy]:
    """The policy called ``name`` (or one of its aliases, any case); the error lists the names."""
    _scan()
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    try:
        return _POLICIES[key]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(_POLICIES)}") from None


def all_policies() -> list[type[Policy]]:
    _scan()
    return list(_POLICIES.values())


# kind -> the package whose __init__ imports (so registers) every executor of that kind; imported by name at lookup
EXECUTOR_PACKAGES = {"runtime": "pushpull.torch.executors", "simulator": "pushpull.sim.executors"}
_EXECUTORS: dict[tuple[str, str], type] = {}  # (strategy name, kind) -> executor class


def register_executor(name: str, kind: str):
    """Class decorator: the class carries out strategy ``name`` in ``kind`` (``"runtime"`` on real tensors,
    ``"simulator"`` on a model profile), for a policy whose ``runtime`` / ``simulator`` is :data:`OWN`."""
    if kind not in EXECUTOR_PACKAGES:
        raise ValueError(f"executor kind {kind!r}: choose from {', '.join(EXECUTOR_PACKAGES)}")

    def register(cls: type) -> type:
        other = _EXECUTORS.get((name, kind))
        if other is not None and (other.__module__, other.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"strategy {name!r} has two {kind} executors: {other.__module__}.{other.__qualname__} "
                             f"and {cls.__module__}.{cls.__qualname__}")
        _EXECUTORS[(name, kind)] = cls
        return cls
    return register


def executor(name: str, kind: str) -> type:
    """The ``kind`` executor registered for strategy ``name`` (its policy's ``runtime`` / ``simulator`` is
    :data:`OWN`), after importing that kind's package of executors; LookupError names both when none is."""
    package = EXECUTOR_PACKAGES.get(kind)
    if package is None:
        raise ValueError(f"executor kind {kind!r}: choose from {', '.join(EXECUTOR_PACKAGES)}")
    importlib.import_module(package)  # its __init__ imports (so registers) every executor of the kind
    try:
        return _EXECUTORS[(name, kind)]
    except KeyError:
        raise LookupError(f"strategy {name!r} has no {kind} executor registered (a class in {package} "
                          f"with @register_executor({name!r}, {kind!r}))") from None


__all__ = ["Policy", "OWN", "ABSENT", "names", "aliases", "get", "all_policies", "refresh", "register_executor",
           "executor", "EXECUTOR_PACKAGES"]
