"""One check for a value that must be one of a closed set (as MONAI's ``look_up_option``).

Every place that accepts a string choice (``lms=``, ``backend.precision=``, ``model.norm=``,
``evaluate.mode=``, a layout, ...) checks it with :func:`check_choice`, so the error always
has the same shape: the key as the user typed it, the bad value, the values allowed and,
for a near miss, the one probably meant::

    trainer.lr_schedule='cosin': use cosine or constant. Did you mean 'cosine'?

The config schemas type their closed sets with :func:`choice_type` (a ``str`` Enum whose
member names are its values), so Hydra refuses a bad value at composition, naming the
allowed ones; the value still compares, hashes, prints and serialises as the plain string
(``Precision.bf16 == "bf16"``, ``f"{p}"`` is ``bf16``, JSON ``"bf16"``).

Standard library only: a leaf that any module may import, ``config.py`` included.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from enum import Enum
from typing import TypeVar

__all__ = ["StrChoice", "check_choice", "choice_type", "choice_values", "format_choices"]

T = TypeVar("T")


def format_choices(allowed: Iterable[object]) -> str:
    """``a or b`` for two values, ``one of a, b, c`` for more (as the project's messages say it)."""
    names = [str(a.value if isinstance(a, Enum) else a) for a in allowed]
    if len(names) == 2:
        return f"{names[0]} or {names[1]}"
    return f"one of {', '.join(names)}"


def check_choice(value: T, allowed: Iterable[T], key: str, *, error: type[Exception] = ValueError, hint: str = "") -> T:
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
    choices = tuple(c.value if isinstance(c, Enum) else c for c in allowed)  # a choice_type lists its values
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


class StrChoice(str, Enum):
    """Base of the closed sets of :func:`choice_type`: prints and formats as its value."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


def choice_type(name: str, values: Iterable[str], module: str) -> type[StrChoice]:
    """A closed set of strings as a ``str`` Enum whose member names are the values
    (``raise`` and ``none`` included), for a config field that Hydra checks at composition.

    Args:
        name: the type's name (``Precision``).
        values: the allowed values, in the order messages list them.
        module: the defining module's ``__name__`` (so members pickle across processes).
    """
    return StrChoice(name, [(v, v) for v in values], module=module)


def choice_values(choice: type[Enum]) -> tuple[str, ...]:
    """The plain string values of a :func:`choice_type`, in order."""
    return tuple(m.value for m in choice)
