"""Reading ``POST …/resources/files``: the one ``file`` part streamed into the store.

Django's default upload handlers keep a file in memory up to
``FILE_UPLOAD_MAX_MEMORY_SIZE`` and then in a temporary file, and only afterwards
does a view see its size. Here the multipart parser is given one handler,
:class:`SessionFileUpload`, which writes each chunk straight into the store's
temporary file (``file_store.BlobWriter``: hashed, counted and UTF-8-checked as it
goes) and stops with 413 the moment the count passes ``OMNIGENT_MAX_UPLOAD_BYTES``.
What reaches this parser is already bounded by the socket-level limit
(``omnigent_site.runtime.body_limit``), so an oversize body is never held whole.

Django's parser also cuts a file name down to what follows its last ``/`` or ``\\``
(and unescapes HTML entities, and drops characters that do not print); files.md wants
such a name refused (400), so this parser keeps the name as sent. The body is parsed
when something first reads it: the view, or, for a login session (the web page), DRF's
CSRF check while the request is authenticated, before the view runs. The view makes its
handler before either (``initial``), so both paths parse here, with one set of name
rules (``file_types.check_filename``).
"""

from __future__ import annotations

import io
from typing import Any

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler
from django.http.multipartparser import MultiPartParser as DjangoMultiPartParser
from django.http.multipartparser import MultiPartParserError
from rest_framework.exceptions import ParseError
from rest_framework.parsers import DataAndFiles

from omnigent_site.domain_errors import InvalidInput, PayloadTooLarge
from omnigent_site.parsers import MultiPartParser, strict_context
from omnigent_site.utf8_input import not_utf8_message

from .file_store import BlobWriter, TooLarge
from .file_types import check_filename

FILE_PART = "file"


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"the file is larger than the limit of {limit} bytes")


class SessionFileUpload(FileUploadHandler):
    """Streams the ``file`` part into a :class:`BlobWriter`; refuses anything else."""

    def __init__(self, *, limit: int) -> None:
        super().__init__(None)
        self.limit = limit
        self.writer: BlobWriter | None = None
        self.name: str | None = None

    def handle_raw_input(
        self,
        input_data: Any,
        META: dict[str, Any],  # noqa: N803 - Django's name
        content_length: int,
        boundary: str,
        encoding: str | None = None,
    ) -> None:
        overhead = int(settings.OMNIGENT_UPLOAD_OVERHEAD_BYTES)
        if content_length and content_length > self.limit + overhead:
            raise _too_large(self.limit)

    def new_file(self, field_name: str, file_name: str, *args: Any, **kwargs: Any) -> None:
        super().new_file(field_name, file_name, *args, **kwargs)
        if field_name != FILE_PART:
            raise InvalidInput(
                f"unknown multipart part {field_name!r}: send one part 'file'", field=field_name
            )
        if self.writer is not None:
            raise InvalidInput("send one file per upload", field=FILE_PART)
        self.name = check_filename(file_name)
        self.writer = BlobWriter(limit=self.limit)

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        assert self.writer is not None
        try:
            self.writer.write(raw_data)
        except TooLarge:
            raise _too_large(self.limit) from None

    def file_complete(self, file_size: int) -> UploadedFile:
        assert self.writer is not None
        self.writer.finish()
        # The bytes stay with the writer; FILES gets a stand-in so the view sees the part.
        return UploadedFile(file=io.BytesIO(), name=self.name, size=self.writer.size)

    def upload_interrupted(self) -> None:
        self.discard()

    def discard(self) -> None:
        if self.writer is not None:
            self.writer.discard()


class _NameKeepingParser(DjangoMultiPartParser):
    def sanitize_file_name(self, file_name: str) -> str:
        # Checked (and refused) by ``check_filename`` instead of silently shortened.
        return file_name


class SessionFileParser(MultiPartParser):
    """The project's multipart parser with the view's :class:`SessionFileUpload` as the
    handler."""

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        context = parser_context or {}
        upload = getattr(context.get("view"), "upload", None)
        if not isinstance(upload, SessionFileUpload):
            # Never Django's default handlers: they would shorten the name, not refuse it.
            raise ParseError("this request takes no upload")
        request = context["request"]
        meta = request.META.copy()
        meta["CONTENT_TYPE"] = media_type
        encoding = strict_context(context)["encoding"]
        try:
            data, files = _NameKeepingParser(meta, stream, [upload], encoding).parse()
        except MultiPartParserError as exc:
            raise ParseError(f"multipart form parse error: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise ParseError(not_utf8_message("a multipart field", exc)) from None
        return DataAndFiles(data, files)
