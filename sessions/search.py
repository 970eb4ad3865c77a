"""Search of sessions by what was said (lifecycle.md, Search), over ``search_index``.

A query is split on white space into words. A session matches when its title, or one
of its items, holds every word: each word's letters and digits as a word or the start
of one (a word with punctuation inside, ``foo-bar``, as consecutive words, the last a
prefix), case-insensitive and accent-insensitive. A word with characters the index
does not keep (``50%``, ``a_b``, ``"x``) must also appear literally
(case-insensitively): ``%``, ``_`` and quotes are never wildcards or syntax.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from dataclasses import replace as with_changes

from django.db import connection
from django.db.models import BooleanField, Q, QuerySet
from django.db.models.expressions import RawSQL

from omnigent_site.domain_errors import InvalidInput
from omnigent_site.pagination import ListParams, Page, paginate
from omnigent_site.rawsql import quoted

from . import search_index
from .models import Session

MAX_QUERY_CHARS = 256
MAX_WORDS = 16
SNIPPET_CHARS = 200
# Characters of context kept before the first match in a snippet.
SNIPPET_LEAD = 60
OPEN_MARK, CLOSE_MARK = "\u00ab", "\u00bb"
# Sessions of the list looked at first, in the list's order, for each row of the page
# (``page``); the index-wide filter runs only when they hold too few matches.
WINDOW_PER_ROW = 2
MIN_WINDOW = 50

_TOKEN = re.compile(r"[^\W_]+")


def fold(text: str) -> str:
    """Lower case without accents, as the index compares."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch)).lower()


@dataclass(frozen=True)
class Word:
    tokens: tuple[str, ...]  # folded; the last one matches as a prefix
    literal: str | None  # the word as typed, when it has characters the index drops


@dataclass(frozen=True)
class Query:
    words: tuple[Word, ...]


def parse(text: str) -> Query | None:
    """The query, or None for a blank one (no search)."""
    if len(text) > MAX_QUERY_CHARS:
        raise InvalidInput(f"at most {MAX_QUERY_CHARS} characters", field="search_query")
    words = []
    for raw in text.split():
        tokens = tuple(fold(token) for token in _TOKEN.findall(raw))
        tokens = tuple(token for token in tokens if token)
        literal = None if _TOKEN.fullmatch(raw) else raw
        words.append(Word(tokens=tokens, literal=literal))
    if not words:
        return None
    if len(words) > MAX_WORDS:
        raise InvalidInput(f"at most {MAX_WORDS} words", field="search_query")
    return Query(words=tuple(words))


def _like_pattern(literal: str) -> str:
    escaped = literal.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _fts5_expression(query: Query) -> str | None:
    phrases = ['"' + " ".join(word.tokens) + '"*' for word in query.words if word.tokens]
    return " AND ".join(phrases) or None


def _tsquery(query: Query) -> str | None:
    parts = []
    for word in query.words:
        if word.tokens:
            lexemes = [f"'{token}'" for token in word.tokens]
            lexemes[-1] += ":*"
            parts.append("(" + " <-> ".join(lexemes) + ")")
    return " & ".join(parts) or None


def _match_sql(query: Query, *, titles: bool) -> tuple[str, list[str], str]:
    """``(where, params, table)``: the condition on index table ``table`` for rows that
    hold every word; its rows have ``session_id`` and ``body``."""
    conditions: list[str] = []
    params: list[str] = []
    if connection.vendor == "postgresql":
        table = search_index.TITLE_SEARCH if titles else search_index.ITEM_SEARCH
        tsquery = _tsquery(query)
        if tsquery is not None:
            conditions.append(f"{table}.document @@ to_tsquery('simple', omnigent_search_fold(%s))")
            params.append(tsquery)
        # With a tsquery the literal part only rechecks its few rows: as ``lower() LIKE``
        # the trigram index cannot serve it, which the planner chose otherwise and then
        # read every row holding a common trigram (``cabe-cebe``: 50,000 of 120,000).
        body = f"lower({table}.body)" if tsquery is not None else f"{table}.body"
        like = "LIKE lower(%s)" if tsquery is not None else "ILIKE %s"
    else:
        table = search_index.TITLE_FTS if titles else search_index.ITEM_FTS
        expression = _fts5_expression(query)
        if expression is not None:
            conditions.append(f"{table} MATCH %s")
            params.append(expression)
        body, like = f"{table}.body", "LIKE %s"
    for word in query.words:
        if word.literal is not None:
            conditions.append(f"{body} {like} ESCAPE '\\'")
            params.append(_like_pattern(word.literal))
    return " AND ".join(conditions), params, table


def filter_sessions(queryset: QuerySet[Session], query: Query) -> QuerySet[Session]:
    """``queryset`` narrowed to sessions whose title or one of whose items matches.

    PostgreSQL: an ``EXISTS`` per session on its items, or its id among the title
    matches, so the planner picks per query from the index's statistics: a common word
    walks the sessions in the list's order and stops at the page's end (about one item
    read per session), a rare one reads its few matches from the GIN index once. (One
    ``IN`` over every matching item read all 120,000 rows for a common word.)
    SQLite: the index's matches, each mapped to its session through the item row
    (``rowid`` = ``seq``), cheaper than the FTS table's own ``session_id`` column."""
    items_where, items_params, items_table = _match_sql(query, titles=False)
    titles_where, titles_params, titles_table = _match_sql(query, titles=True)
    titles = RawSQL(
        f"SELECT {titles_table}.session_id FROM {titles_table} WHERE {titles_where}",
        titles_params,
    )
    if connection.vendor == "postgresql":
        items = RawSQL(
            f"EXISTS (SELECT 1 FROM {items_table} WHERE {items_table}.session_id = "
            f"{quoted(Session)}.{quoted(Session, 'id')} AND {items_where})",
            items_params,
            output_field=BooleanField(),
        )
        return queryset.filter(Q(items) | Q(pk__in=titles))
    item = connection.ops.quote_name(search_index.ITEM_TABLE)
    matching = RawSQL(
        f"SELECT i.session_id FROM {items_table} CROSS JOIN {item} i "
        f"ON i.seq = {items_table}.rowid WHERE {items_where} UNION ALL "
        f"SELECT {titles_table}.session_id FROM {titles_table} WHERE {titles_where}",
        [*items_params, *titles_params],
    )
    return queryset.filter(pk__in=matching)


@dataclass(frozen=True)
class Hit:
    item_id: str
    snippet: str


# A matching session's first matching item: (item id, its indexed text); None for a
# session that matches by its title alone.
First = tuple[str, str] | None


def matches(query: Query, session_ids: list[str]) -> dict[str, First]:
    """Which of these sessions match, each with its first matching item (in order)."""
    if not session_ids:
        return {}
    if connection.vendor == "postgresql":
        return _postgres_matches(query, session_ids)
    return _sqlite_matches(query, session_ids)


def first_hits(query: Query, session_ids: list[str]) -> dict[str, Hit]:
    """For each of these sessions with a matching item, its first one (in order) and
    the snippet around the match; a session matched by its title alone is absent."""
    return _hits(query, session_ids, matches(query, session_ids))


def _hits(query: Query, session_ids: list[str], found: dict[str, First]) -> dict[str, Hit]:
    return {
        session_id: Hit(item_id=first[0], snippet=snippet(first[1], query))
        for session_id in session_ids
        if (first := found.get(session_id)) is not None
    }


def _postgres_matches(query: Query, session_ids: list[str]) -> dict[str, First]:
    """``matches`` on PostgreSQL: the planner reads these sessions' rows (by the
    ``session_id`` index) or intersects them with the GIN index, whichever its
    statistics say is cheaper, never the index's every match."""
    where, params, table = _match_sql(query, titles=False)
    titles_where, titles_params, titles_table = _match_sql(query, titles=True)
    marks = ", ".join(["%s"] * len(session_ids))
    item = connection.ops.quote_name(search_index.ITEM_TABLE)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {titles_table}.session_id FROM {titles_table} WHERE {titles_where} "
            f"AND {titles_table}.session_id IN ({marks})",
            [*titles_params, *session_ids],
        )
        found: dict[str, First] = {session_id: None for (session_id,) in cursor.fetchall()}
        cursor.execute(
            f"SELECT i.session_id, i.id, f.body FROM {item} i JOIN ("
            f"SELECT {table}.session_id AS session_id, MIN({table}.item_seq) AS seq "
            f"FROM {table} WHERE {where} AND {table}.session_id IN ({marks}) "
            f"GROUP BY {table}.session_id) m ON i.seq = m.seq "
            f"JOIN {table} f ON f.item_seq = m.seq",
            [*params, *session_ids],
        )
        for session_id, item_id, body in cursor.fetchall():
            found[session_id] = (item_id, body)
    return found


def _sqlite_matches(query: Query, session_ids: list[str]) -> dict[str, First]:
    """``matches`` on SQLite.

    One FTS5 query over the rowids (item ``seq``) between the sessions' first and last
    item, mapped to sessions through the item rows, so its cost follows the matches in
    that span, not in the whole index. (Each FTS5 query with a prefix word merges the
    postings of every word with that prefix, a few ms for a common one: one query, not
    one per session.)"""
    marks = ", ".join(["%s"] * len(session_ids))
    item = connection.ops.quote_name(search_index.ITEM_TABLE)
    where, params, table = _match_sql(query, titles=False)
    titles_where, titles_params, titles_table = _match_sql(query, titles=True)
    first: dict[str, int] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT MIN(seq), MAX(seq) FROM {item} WHERE session_id IN ({marks})", session_ids
        )
        low, high = cursor.fetchone()
        if low is not None:
            # CROSS JOIN: the FTS table first (one query), each match's item by rowid.
            cursor.execute(
                f"SELECT {table}.rowid, i.session_id FROM {table} CROSS JOIN {item} i "
                f"ON i.seq = {table}.rowid WHERE {where} AND {table}.rowid BETWEEN %s AND %s "
                f"AND +i.session_id IN ({marks}) ORDER BY {table}.rowid",
                [*params, low, high, *session_ids],
            )
            for seq, session_id in cursor.fetchall():
                first.setdefault(session_id, seq)
        cursor.execute(
            f"SELECT {titles_table}.session_id FROM {titles_table} WHERE {titles_where} "
            f"AND {titles_table}.session_id IN ({marks})",
            [*titles_params, *session_ids],
        )
        found: dict[str, First] = {session_id: None for (session_id,) in cursor.fetchall()}
        if first:
            seqs = list(first.values())
            cursor.execute(
                f"SELECT i.session_id, i.id, {table}.body FROM {table} CROSS JOIN {item} i "
                f"ON i.seq = {table}.rowid WHERE {table}.rowid IN "
                f"({', '.join(['%s'] * len(seqs))})",
                seqs,
            )
            for session_id, item_id, body in cursor.fetchall():
                found[session_id] = (item_id, body)
    return found


def page(
    queryset: QuerySet[Session], query: Query, params: ListParams, *, sort_field: str
) -> tuple[Page, dict[str, Hit]]:
    """One page of the sessions of ``queryset`` that match, in the list's order, and the
    first matching item of each that has one.

    A common word matches most sessions, and reading every match to list twenty of them
    is what made it slow (issue 41). So the page is looked for first in a window of the
    list's next sessions, ``WINDOW_PER_ROW`` per row of the page: when the window holds
    a page and one more of matches, or reaches the list's end, those are the page (every
    session before the page's last row is in the window, so none is missed). Else the
    words are rare enough for ``filter_sessions`` over the whole index. Either way the
    rows are those of the filtered list, cursors included."""
    size = max(MIN_WINDOW, WINDOW_PER_ROW * (params.limit + 1))
    window = paginate(
        queryset.select_related(None).only("pk", sort_field),
        with_changes(params, limit=size),
        sort_field=sort_field,
    )
    ids = [session.id for session in window.objects]
    cursor = params.after or params.before
    # The cursor's session too: the page's query looks it up among the matches.
    found = matches(query, [*ids, cursor] if cursor else ids)
    in_window = sum(1 for session_id in ids if session_id in found)
    if in_window > params.limit or not window.has_more:
        result = paginate(queryset.filter(pk__in=list(found)), params, sort_field=sort_field)
    else:
        result = paginate(filter_sessions(queryset, query), params, sort_field=sort_field)
        found = matches(query, [session.id for session in result.objects])
    # Snippets of the page's rows only.
    return result, _hits(query, [session.id for session in result.objects], found)


def _word_matches(token: str, query: Query) -> bool:
    folded = fold(token)
    for word in query.words:
        if not word.tokens:
            continue
        *whole, last = word.tokens
        if folded in whole or folded.startswith(last):
            return True
    return False


def snippet(body: str, query: Query) -> str:
    """At most ``SNIPPET_CHARS`` characters of ``body`` (white space collapsed) around
    the first match, each matched word between ``«`` and ``»`` (not counted)."""
    text = " ".join(body.split())
    spans: list[tuple[int, int]] = [
        match.span() for match in _TOKEN.finditer(text) if _word_matches(match.group(), query)
    ]
    lowered = text.lower()
    for word in query.words:
        if word.literal is not None and not word.tokens:
            at = lowered.find(word.literal.lower())
            if at >= 0:
                spans.append((at, at + len(word.literal)))
    spans.sort()
    first = spans[0][0] if spans else 0
    start = max(0, first - SNIPPET_LEAD)
    end = min(len(text), start + SNIPPET_CHARS)
    start = max(0, end - SNIPPET_CHARS)
    if start > 0 and text[start - 1] != " ":
        space = text.find(" ", start, first)
        start = space + 1 if space >= 0 else start
    if end < len(text) and text[end] != " ":
        space = text.rfind(" ", max(start, spans[0][1] if spans else start), end)
        end = space if space >= 0 else end
    out: list[str] = []
    at = start
    for span_start, span_end in spans:
        if span_start < at or span_end > end:
            continue
        out += [text[at:span_start], OPEN_MARK, text[span_start:span_end], CLOSE_MARK]
        at = span_end
    out.append(text[at:end])
    return "".join(out).strip()
