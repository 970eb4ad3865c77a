"""Input checks of the workspace endpoints: the environment and path of the URL, the
bodies of a write and an edit, and the query parameters of reads and search.

What the endpoints return is in ``shapes.py``.
"""

from __future__ import annotations

import posixpath
from typing import Any

from rest_framework import serializers
from rest_framework.exceptions import NotFound, ValidationError

from omnigent_runner.workspace_fs import path_length_problem
from omnigent_site.strict_fields import StrictBooleanField, StrictCharField, StrictChoiceField

ENVIRONMENTS = {"default"}


def check_environment(env: str) -> str:
    if env not in ENVIRONMENTS:
        raise NotFound(f"environment {env!r} not found")
    return env


def check_relative_path(path: str) -> str:
    """The runner's path rules that need no file system (it checks them again)."""
    if not path or "\x00" in path:
        raise ValidationError({"path": ["the path is empty or contains NUL"]})
    too_long = path_length_problem(path)
    if too_long:
        raise ValidationError({"path": [too_long]})
    if path.startswith("/") or posixpath.isabs(path) or (len(path) > 1 and path[1] == ":"):
        raise ValidationError({"path": ["the path must be relative to the workspace"]})
    if ".." in path.replace("\\", "/").split("/"):
        raise ValidationError({"path": ["the path must not contain '..'"]})
    return path


# --- the workspace through the server (files.md §2) ---------------------------------------


class WorkspaceWriteSerializer(serializers.Serializer):
    """``PUT …/filesystem/{path}``: the file's whole new content."""

    content = StrictCharField(allow_blank=True, trim_whitespace=False)
    encoding = StrictChoiceField(choices=["utf-8", "base64"], default="utf-8")
    create_parents = StrictBooleanField(default=False)


class WorkspaceEditSerializer(serializers.Serializer):
    """``PATCH …/filesystem/{path}``: an exact-text replacement (``sys_os_edit``'s rules)."""

    old_text = StrictCharField(trim_whitespace=False)
    new_text = StrictCharField(allow_blank=True, trim_whitespace=False)
    replace_all = StrictBooleanField(default=False)


def query_flag(query: Any, name: str) -> bool:
    """A boolean query parameter: ``1``/``true``/``yes`` or ``0``/``false``/``no``."""
    raw = query.get(name)
    if raw in (None, ""):
        return False
    value = str(raw).lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ValidationError({name: ["must be true or false"]})


def query_limit(query: Any, *, maximum: int) -> int | None:
    raw = query.get("limit")
    if raw in (None, ""):
        return None
    try:
        value = int(str(raw))
    except ValueError:
        raise ValidationError({"limit": [f"must be an integer, got {raw!r}"]}) from None
    if not 1 <= value <= maximum:
        raise ValidationError({"limit": [f"must be between 1 and {maximum}"]})
    return value
