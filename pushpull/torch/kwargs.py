"""Unknown keyword arguments are errors that name the nearest valid one.

Why: a misspelt option (``backward_passes_per_stp=2``) that is silently ignored trains a different model
than the one written down. Horovod-only options that pushpull does not provide get an error that says so.
The check costs nothing on a call that binds: it only looks when Python's own binding failed.
"""
from __future__ import annotations

import difflib
import functools
import inspect

# options of Horovod's torch API that pushpull does not take, and what to do instead
HOROVOD_ONLY = {
    "num_groups": "Horovod's num_groups (grouping allreduces) is not provided by pushpull: fusion is a "
                  "strategy here (strategy='fusion' or 'bsp', docs/scheduling.md)",
    "groups": "Horovod's groups (grouping allreduces) is not provided by pushpull: fusion is a strategy here "
              "(strategy='fusion' or 'bsp', docs/scheduling.md)",
    "device_dense": "device_dense is a TensorFlow option: pushpull.torch reduces on the tensor's device",
    "device_sparse": "device_sparse is a TensorFlow option; pushpull does not reduce sparse tensors",
    "ignore_name_scope": "ignore_name_scope is a TensorFlow option",
    "enable_async": "asynchronous training is DistributedOptimizer(..., asynchronous=True) (or BYTEPS_ENABLE_ASYNC=1, "
                    "or pushpull.torch.AsyncOptimizer) in pushpull.torch",
}


def unknown_keyword(func: str, bad: str, valid) -> TypeError:
    if bad in HOROVOD_ONLY:
        return TypeError(f"{func}() got the keyword argument {bad!r}: {HOROVOD_ONLY[bad]}")
    near = difflib.get_close_matches(bad, list(valid), n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]!r}?" if near else f"; valid ones: {', '.join(sorted(valid))}"
    return TypeError(f"{func}() got an unexpected keyword argument {bad!r}{hint}")


def checked(fn):
    """Wrap ``fn`` so that an unexpected keyword argument raises :func:`unknown_keyword`'s error."""
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        raise TypeError(f"{fn.__name__} takes **kwargs: check them where they are used")
    valid = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError:
            bad = [k for k in kwargs if k not in params]
            if bad:  # binding failed before the body ran
                raise unknown_keyword(fn.__name__, bad[0], valid) from None
            raise
    return wrapper
