"""pandas, only when needed: keep its import out of the direct engine's job.

The direct engine works on numpy and pyarrow alone, but pyarrow imports pandas (about 0.17 s of
the job's start, with the GIL held) on its first numpy conversion, only to learn pandas' missing
value sentinels, which float, integer and string columns do not need. :func:`pandas_deferred` keeps
that import out of the job; the slow paths that do use pandas ask for it with :func:`import_pandas`.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager


class _DeferPandas:
    """A ``sys.meta_path`` finder that refuses to import pandas while it is installed."""

    def find_spec(self, name: str, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is deferred in the direct engine: call airflow_ray_ml_stages.data.deferred_pandas.import_pandas()")
        return None


_DEFER_PANDAS = _DeferPandas()
_DEFER_LOCK = threading.Lock()


def _lift_pandas_block() -> bool:
    with _DEFER_LOCK:
        if _DEFER_PANDAS not in sys.meta_path:
            return False
        sys.meta_path.remove(_DEFER_PANDAS)
        return True


def import_pandas():
    """Import pandas (lifting a ``pandas_deferred`` block first) and return it."""
    if _lift_pandas_block():
        # pyarrow remembers a failed import; an explicit request makes it try again.
        import pyarrow.lib

        pyarrow.lib._pandas_api.compat  # noqa: B018 - the property re-imports pandas into pyarrow
    import pandas

    return pandas


@contextmanager
def pandas_deferred():
    """Keep pandas unimported inside the block unless something calls :func:`import_pandas`.

    A no-op where pandas is already imported (in-process callers, tests).
    """
    if "pandas" in sys.modules or _DEFER_PANDAS in sys.meta_path:
        yield
        return
    sys.meta_path.insert(0, _DEFER_PANDAS)
    try:
        yield
    finally:
        _lift_pandas_block()
