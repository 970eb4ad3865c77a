"""Input checks of the changes and diff endpoints: the environment and the path of the URL.

What the endpoints return is in ``shapes.py``.
"""

from __future__ import annotations

import posixpath

from rest_framework.exceptions import NotFound, ValidationError

ENVIRONMENTS = {"default"}


def check_environment(env: str) -> str:
    if env not in ENVIRONMENTS:
        raise NotFound(f"environment {env!r} not found")
    return env


def check_relative_path(path: str) -> str:
    if not path or "\x00" in path:
        raise ValidationError({"path": ["the path is empty or contains NUL"]})
    if path.startswith("/") or posixpath.isabs(path) or (len(path) > 1 and path[1] == ":"):
        raise ValidationError({"path": ["the path must be relative to the workspace"]})
    if ".." in path.replace("\\", "/").split("/"):
        raise ValidationError({"path": ["the path must not contain '..'"]})
    return path
