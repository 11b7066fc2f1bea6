"""Priority classes: which waiting request a busy replica serves next (llmgw/gateway/fairqueue.py).

A key carries a class (`ApiKey.priority`); a request may ask for its key's class or a lower one with
the `x-llmgw-priority` header, never a higher one. Highest first: `system` (the platform's own calls),
`interactive` (a person waits on the answer), `default`, `bulk` (batch work that can wait).
"""

from __future__ import annotations

CLASSES = ("system", "interactive", "default", "bulk")  # highest first: a class's rank is its index
DEFAULT = "default"
HEADER = b"x-llmgw-priority"
RANK = {name: rank for rank, name in enumerate(CLASSES)}


def class_problem(value: object) -> str | None:
    """What is wrong with a class name, in words; None: it is one."""
    if isinstance(value, str) and value in RANK:
        return None
    return f"priority must be one of {', '.join(CLASSES)} (highest first), not {value!r:.40}"


def requested(key_class: str, asked: str | None) -> str:
    """The class a request runs in: its key's, or the lower (or equal) one `asked` for (None: not asked).
    ValueError with the words of the refusal: an unknown class, or one above the key's."""
    if asked is None:
        return key_class
    problem = class_problem(asked)
    if problem is not None:
        raise ValueError(problem)
    if RANK[asked] < RANK.get(key_class, RANK[DEFAULT]):
        raise PermissionError(f"this key's priority class is {key_class!r}: a request may ask for it or a lower "
                              f"one ({', '.join(CLASSES[RANK.get(key_class, RANK[DEFAULT]):])}), not {asked!r}")
    return asked
