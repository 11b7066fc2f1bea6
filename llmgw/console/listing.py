"""Server-side listing for the console's long tables (Nodes, Models): the query a page was asked with
(`?q=&sort=&dir=&page=&per_page=` and its own filters), sorting with unknowns last, one page's slice.

Everything is in the URL, so a listing sorts, filters and pages without JavaScript, and a link to it
shows the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TypeVar

from llmgw.console.layout import esc, page_number, pager, with_query

T = TypeVar("T")
PER_PAGE = (25, 50, 100, 200)
DEFAULT_PER_PAGE = 50
MAX_QUERY_CHARS = 200  # a filter text longer than this is cut: it only narrows the rows


@dataclass(frozen=True)
class Query:
    """A listing's query: text filter, the page's own filters (name -> value, "" = any), sort, page."""

    path: str
    q: str = ""
    filters: Mapping[str, str] = field(default_factory=dict)
    sort: str = ""
    descending: bool = False
    page_raw: str = "1"
    per_page: int = DEFAULT_PER_PAGE

    @classmethod
    def read(cls, path: str, args: Mapping[str, str], sorts: Sequence[str], filters: Sequence[str]) -> Query:
        """The query in `args` (request.args); a sort not in `sorts` is the first, a per-page not offered
        is the default, so a hand-edited URL still answers a listing."""
        sort = args.get("sort", "")
        try:
            per_page = int(args.get("per_page", DEFAULT_PER_PAGE))
        except ValueError:
            per_page = DEFAULT_PER_PAGE
        return cls(path=path, q=args.get("q", "").strip()[:MAX_QUERY_CHARS],
                   filters={f: args.get(f, "").strip()[:MAX_QUERY_CHARS] for f in filters},
                   sort=sort if sort in sorts else sorts[0], descending=args.get("dir") == "desc",
                   page_raw=args.get("page", "1"), per_page=per_page if per_page in PER_PAGE else DEFAULT_PER_PAGE)

    def url(self, **changes: object) -> str:
        """This listing's URL with `changes` (None drops a parameter); defaults are left out."""
        params: dict[str, object] = {"q": self.q or None, **{k: v or None for k, v in self.filters.items()},
                                     "sort": self.sort, "dir": "desc" if self.descending else None,
                                     "per_page": None if self.per_page == DEFAULT_PER_PAGE else self.per_page}
        params.update(changes)
        return with_query(self.path, **params)


@dataclass(frozen=True)
class Slice:
    rows: list[Any]
    total: int
    page: int


def sort_rows(rows: Sequence[T], key: Callable[[T], Any], descending: bool) -> list[T]:
    """Sorted by `key`; rows whose key is None (unknown) come last either way."""
    known = [r for r in rows if key(r) is not None]
    unknown = [r for r in rows if key(r) is None]
    return sorted(known, key=key, reverse=descending) + unknown


def page_of(rows: Sequence[T], query: Query) -> Slice:
    page = page_number(query.page_raw, len(rows), query.per_page)
    start = (page - 1) * query.per_page
    return Slice(list(rows[start:start + query.per_page]), len(rows), page)


def matches(text: str, *values: object) -> bool:
    """Whether the filter text is in any of the values (case-insensitive); an empty text matches."""
    if not text:
        return True
    needle = text.lower()
    return any(needle in str(v).lower() for v in values if v is not None)


def controls(query: Query, *, sorts: Mapping[str, str], selects: Mapping[str, tuple[str, Sequence[str]]],
             testid: str) -> str:
    """The listing's form (GET): text filter, one select per filter (label, choices), sort, order,
    rows per page. `sorts`: sort key -> its label."""
    def options(choices: Sequence[str], chosen: str, any_label: str | None) -> str:
        first = f'<option value="">{esc(any_label)}</option>' if any_label is not None else ""
        return first + "".join(f'<option value="{esc(c)}"{" selected" if c == chosen else ""}>{esc(c)}</option>'
                               for c in choices)

    fields = [f'<label>Filter <input type="search" name="q" value="{esc(query.q)}" '
              f'data-testid="{testid}-q" placeholder="text"></label>']
    for name, (label, choices) in selects.items():
        fields.append(f'<label>{esc(label)} <select name="{esc(name)}" data-testid="{testid}-{esc(name)}">'
                      f'{options(choices, query.filters.get(name, ""), "any")}</select></label>')
    sort_opts = "".join(f'<option value="{esc(k)}"{" selected" if k == query.sort else ""}>{esc(v)}</option>'
                        for k, v in sorts.items())
    fields.append(f'<label>Sort by <select name="sort" data-testid="{testid}-sort">{sort_opts}</select></label>')
    fields.append(f'<label>Order <select name="dir" data-testid="{testid}-dir">'
                  f'<option value="asc"{"" if query.descending else " selected"}>ascending</option>'
                  f'<option value="desc"{" selected" if query.descending else ""}>descending</option></select></label>')
    fields.append(f'<label>Rows <select name="per_page" data-testid="{testid}-per-page">'
                  f'{options([str(n) for n in PER_PAGE], str(query.per_page), None)}</select></label>')
    return (f'<form method="get" action="{esc(query.path)}" class="listing" data-testid="{testid}-form">'
            f'{" ".join(fields)} <button type="submit" data-testid="{testid}-apply">Apply</button> '
            f'<a href="{esc(query.path)}">clear</a></form>')


def pages(part: Slice, query: Query) -> str:
    return pager(part.total, part.page, query.per_page, query.url())
