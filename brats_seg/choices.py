"""One check for a value that must be one of a closed set (as MONAI's ``look_up_option``).

Every place that accepts a string choice (``lms=``, ``backend.precision=``, ``model.norm=``,
``evaluate.mode=``, a layout, ...) checks it with :func:`check_choice`, so the error always
has the same shape: the key as the user typed it, the bad value, the values allowed and,
for a near miss, the one probably meant::

    trainer.lr_schedule='cosin': use cosine or constant. Did you mean 'cosine'?

Standard library only: a leaf that any module may import, ``config.py`` included.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import TypeVar

__all__ = ["check_choice", "format_choices"]

T = TypeVar("T")


def format_choices(allowed: Iterable[object]) -> str:
    """``a or b`` for two values, ``one of a, b, c`` for more (as the project's messages say it)."""
    names = [str(a) for a in allowed]
    if len(names) == 2:
        return f"{names[0]} or {names[1]}"
    return f"one of {', '.join(names)}"


def check_choice(value: T, allowed: Iterable[T], key: str, *, error: type[Exception] = ValueError,
                 hint: str = "") -> T:
    """``value`` if it is one of ``allowed``; else ``error`` naming ``key``, the value and the choices.

    Args:
        value: what the user gave.
        allowed: the closed set, in the order the message should list it.
        key: the config key or argument as the user writes it (``model.norm``).
        error: the exception class to raise (a module's own error type, e.g. ``BackendError``).
        hint: a sentence appended to the message (what the choices mean, where they apply).

    Raises:
        error: ``key=value: use <choices>. [hint] [Did you mean 'x'?]``.
    """
    choices = tuple(allowed)
    if value in choices:
        return value
    message = f"{key}={value!r}: use {format_choices(choices)}."
    if hint:
        message += f" {hint}"
    if isinstance(value, str):
        near = difflib.get_close_matches(value, [c for c in choices if isinstance(c, str)], n=1, cutoff=0.6)
        if near:
            message += f" Did you mean {near[0]!r}?"
    raise error(message)
