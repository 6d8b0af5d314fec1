"""Progress bars for the long benchmark loops (issue 7): a thin layer over tqdm.

Bars go to **stderr only**, never stdout: the JSON results and the stdout summaries stay exactly
as they were. Whether they show follows tqdm's ``disable=None`` convention, overridable:

- ``DHISPARSE_PROGRESS`` unset (or empty): bars show when stderr is a terminal, and are off
  otherwise (pipes, log files, pytest, CI);
- ``DHISPARSE_PROGRESS=1`` (``true``/``yes``/``on``): bars always (e.g. ``2> progress.log``);
- ``DHISPARSE_PROGRESS=0`` (``false``/``no``/``off``): bars never.

Use ``progress(iterable, desc, unit=...)`` to wrap a loop, or ``progress(desc=..., total=n)`` and
``bar.update()`` by hand; ``phase(bar, label, fn, ...)`` runs one named step of a fixed sequence.
Lines a loop prints while a bar is open go through ``echo`` (same text, same stdout, but the bar
is cleared and redrawn around it instead of being torn up). A bar only redraws when a step ends,
between the timed runs (in ``serve``, as each request completes: a few writes to stderr), so the
measurements are unchanged; with bars off (no terminal) it does nothing at all.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from tqdm import tqdm

T = TypeVar("T")
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def _disable() -> bool | None:
    """tqdm's ``disable``: False (forced on), True (forced off) or None (on iff stderr is a TTY)."""
    value = os.environ.get("DHISPARSE_PROGRESS", "").strip().lower()
    if value in _ON:
        return False
    if value in _OFF:
        return True
    return None


def enabled() -> bool:
    """Whether progress output shows now (same rule as the bars)."""
    disable = _disable()
    if disable is None:
        return bool(getattr(sys.stderr, "isatty", lambda: False)())
    return not disable


def progress(iterable: Iterable[T] | None = None, desc: str | None = None, total: int | None = None,
             unit: str = "it", **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr (see the module docstring for when it shows); extra keyword
    arguments go to tqdm (``leave``, ``position``...)."""
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr, disable=_disable(), **kwargs)


def phase(bar: tqdm, label: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Shows ``label`` on ``bar``, returns ``fn(*args, **kwargs)``, then advances the bar by one."""
    bar.set_postfix_str(label)
    value = fn(*args, **kwargs)
    bar.update()
    return value


def echo(line: str) -> None:
    """``print(line, flush=True)`` that keeps open bars intact (tqdm.write to stdout)."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def note(line: str) -> None:
    """A progress line on stderr (e.g. ``[3/9] spec: done in 41.2s``), shown under the same rule
    as the bars."""
    if enabled():
        tqdm.write(line, file=sys.stderr)
        sys.stderr.flush()
