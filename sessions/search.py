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

from django.db import connection
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL

from omnigent_site.domain_errors import InvalidInput

from . import search_index
from .models import Session

MAX_QUERY_CHARS = 256
MAX_WORDS = 16
SNIPPET_CHARS = 200
# Characters of context kept before the first match in a snippet.
SNIPPET_LEAD = 60
OPEN_MARK, CLOSE_MARK = "\u00ab", "\u00bb"

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
        like = "ILIKE"
    else:
        table = search_index.TITLE_FTS if titles else search_index.ITEM_FTS
        expression = _fts5_expression(query)
        if expression is not None:
            conditions.append(f"{table} MATCH %s")
            params.append(expression)
        like = "LIKE"
    for word in query.words:
        if word.literal is not None:
            conditions.append(f"{table}.body {like} %s ESCAPE '\\'")
            params.append(_like_pattern(word.literal))
    return " AND ".join(conditions), params, table


def filter_sessions(queryset: QuerySet[Session], query: Query) -> QuerySet[Session]:
    """``queryset`` narrowed to sessions whose title or one of whose items matches."""
    items_where, items_params, items_table = _match_sql(query, titles=False)
    titles_where, titles_params, titles_table = _match_sql(query, titles=True)
    in_items = RawSQL(
        f"SELECT {items_table}.session_id FROM {items_table} WHERE {items_where}", items_params
    )
    in_titles = RawSQL(
        f"SELECT {titles_table}.session_id FROM {titles_table} WHERE {titles_where}",
        titles_params,
    )
    return queryset.filter(Q(pk__in=in_items) | Q(pk__in=in_titles))


@dataclass(frozen=True)
class Hit:
    item_id: str
    snippet: str


def first_hits(query: Query, session_ids: list[str]) -> dict[str, Hit]:
    """For each of these sessions with a matching item, its first one (in order) and
    the snippet around the match; a session matched by its title alone is absent."""
    if not session_ids:
        return {}
    where, params, table = _match_sql(query, titles=False)
    key = "item_seq" if connection.vendor == "postgresql" else "rowid"
    marks = ", ".join(["%s"] * len(session_ids))
    item = connection.ops.quote_name(search_index.ITEM_TABLE)
    sql = (
        f"SELECT i.session_id, i.id, f.body FROM {item} i JOIN ("
        f"SELECT {table}.session_id AS session_id, MIN({table}.{key}) AS seq FROM {table} "
        f"WHERE {where} AND {table}.session_id IN ({marks}) GROUP BY {table}.session_id"
        f") m ON i.seq = m.seq JOIN {table} f ON f.{key} = m.seq"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *session_ids])
        found = cursor.fetchall()
    return {
        session_id: Hit(item_id=item_id, snippet=snippet(body, query))
        for session_id, item_id, body in found
    }


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
