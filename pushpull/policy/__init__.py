"""The strategy registry: every module of this package that defines a :class:`~pushpull.policy.base.Policy`
subclass with a ``name`` is a strategy, found by scanning the package (``__path__``, and any other
``pushpull/policy`` directory on ``sys.path``: :mod:`pushpull.extend`), so adding one is adding a file.
The runtime, the simulator, the benchmark grid and the configuration read their names here.
"""
from __future__ import annotations

from pushpull.extend import extend_package_path, import_all
from pushpull.policy.base import Policy

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


__all__ = ["Policy", "names", "aliases", "get", "all_policies", "refresh"]
