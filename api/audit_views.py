"""The audit log (lifecycle.md, Audit log): ``GET /v1/audit``, a cursor list or, with
``?format=jsonl``, every matching record as JSON Lines."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from types import SimpleNamespace

from asgiref.sync import sync_to_async
from django.db.models import QuerySet
from django.http import HttpResponseBase, StreamingHttpResponse
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.models import AuditRecord
from audit.selectors import AuditFilters, records_visible_to
from audit.shapes import AuditPage, audit_record
from omnigent_site.authentication import request_user
from omnigent_site.pagination import ListParams, paginate, parse_list_params
from omnigent_site.renderers import JSONRenderer, json_bytes
from omnigent_site.schema import error_responses, list_parameters
from omnigent_site.users import is_admin
from sessions.selectors import managed_session_ids

JSONL = "application/jsonl"
# Records per database read of the JSON Lines stream: memory stays flat however many.
STREAM_BATCH = 500


class OwnFormatParameter(DefaultContentNegotiation):
    """``?format=`` is this view's own parameter (validated, 400 when unknown), not DRF's
    renderer override, which would answer an unknown value with 404 and render errors
    of a ``jsonl`` request as JSON Lines; responses other than the stream are JSON."""

    settings = SimpleNamespace(URL_FORMAT_OVERRIDE=None)  # type: ignore[assignment]


def _output_format(query: Mapping[str, str]) -> str:
    value = query.get("format") or "json"
    if value not in ("json", "jsonl"):
        raise ValidationError({"format": [f"must be 'json' or 'jsonl', not {value!r}"]})
    return value


def _instant(query: Mapping[str, str], name: str) -> datetime | None:
    """``since``/``until``: Unix seconds or an ISO 8601 date-time (UTC when no offset)."""
    raw = (query.get(name) or "").strip()
    if not raw:
        return None
    if raw.isascii() and raw.lstrip("-").isdigit() and len(raw) <= 12:
        return datetime.fromtimestamp(int(raw), tz=UTC)
    try:
        parsed = parse_datetime(raw)
    except ValueError:
        parsed = None
    if parsed is None:
        raise ValidationError({name: ["must be Unix seconds or an ISO 8601 date-time"]})
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _cursor(value: str | None, name: str) -> str | None:
    """An ``aud_<n>`` id as the record's primary key (a string of digits)."""
    if value is None:
        return None
    digits = value.removeprefix("aud_")
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 19:
        raise ValidationError({name: [f"unknown cursor {value!r}"]})
    return digits


def _stream_batch(
    records: QuerySet[AuditRecord], *, ascending: bool, past: int | None
) -> tuple[bytes, int | None]:
    if past is not None:
        records = records.filter(pk__gt=past) if ascending else records.filter(pk__lt=past)
    batch = list(records.order_by("pk" if ascending else "-pk")[:STREAM_BATCH])
    return b"".join(json_bytes(audit_record(record)) for record in batch), (
        batch[-1].pk if len(batch) == STREAM_BATCH else None
    )


async def _jsonl(
    records: QuerySet[AuditRecord], *, ascending: bool, past: int | None
) -> AsyncIterator[bytes]:
    read = sync_to_async(_stream_batch)
    while True:
        chunk, past = await read(records, ascending=ascending, past=past)
        if chunk:
            yield chunk
        if past is None:
            return


class AuditListView(APIView):
    permission_classes = [IsAuthenticated]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = OwnFormatParameter

    @extend_schema(
        operation_id="audit_list",
        parameters=[
            *list_parameters(default_limit=20, default_order="desc"),
            OpenApiParameter("actor", str, description="the acting user's name"),
            OpenApiParameter("action", str, description="e.g. `approval.verdict`"),
            OpenApiParameter("session_id", str),
            OpenApiParameter("since", str, description="Unix seconds or ISO 8601, inclusive"),
            OpenApiParameter("until", str, description="Unix seconds or ISO 8601, exclusive"),
            OpenApiParameter(
                "format",
                {"type": "string", "enum": ["json", "jsonl"]},
                description="`jsonl`: every matching record, one per line (no `limit`)",
            ),
        ],
        responses={
            (200, "application/json"): AuditPage,
            (200, JSONL): OpenApiResponse(
                OpenApiTypes.STR, description="One record (as in `data`) per line."
            ),
            **error_responses(400, 401),
        },
    )
    def get(self, request: Request) -> HttpResponseBase:
        query = request.query_params
        output = _output_format(query)
        params = parse_list_params(query)
        params = ListParams(
            limit=params.limit,
            order=params.order,
            after=_cursor(params.after, "after"),
            before=_cursor(params.before, "before"),
        )
        filters = AuditFilters(
            actor=query.get("actor") or None,
            action=query.get("action") or None,
            session_id=query.get("session_id") or None,
            since=_instant(query, "since"),
            until=_instant(query, "until"),
        )
        user = request_user(request)
        admin = is_admin(user)
        records = records_visible_to(
            username=user.get_username(),
            is_admin=admin,
            managed_session_ids=None if admin else managed_session_ids(user=user),
            filters=filters,
        )
        if output == "jsonl":
            if params.before is not None:
                raise ValidationError({"before": ["the JSON Lines stream takes 'after' only"]})
            past = int(params.after) if params.after is not None else None
            ascending = params.order == "asc"
            response = StreamingHttpResponse(
                _jsonl(records, ascending=ascending, past=past), content_type=JSONL
            )
            response["Cache-Control"] = "no-store"
            return response
        page = paginate(records, params, sort_field="id")
        return Response(page.body(audit_record, lambda record: record.public_id))
