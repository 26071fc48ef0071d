"""The errors the client raises."""
from __future__ import annotations

import json
import re
from typing import Any, Optional

_GOT = re.compile(r"\(got (.*)\)\s*$")
_MISSING = object()


class FleetError(Exception):
    """Anything this package raises about the fleet."""


class FleetApiError(FleetError):
    """An HTTP error answer of the API, its ``{"error": {"field", "message"}}`` body parsed.

    ``status`` is the HTTP status, ``field`` the field the API named (``samples``, ``tasks.2``,
    ``after``, ``body``, ``authorization``...) or None, ``message`` the API's message (which never
    repeats a value that looks like a credential), and ``value`` what was sent in that field: read
    from the request this client sent when the field names a part of it, else the ``(got ...)`` the
    message quotes, else None.
    """

    def __init__(self, method: str, path: str, status: int, body: bytes, sent: Any = None) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.field: Optional[str] = None
        self.message: str
        try:
            error = json.loads(body)["error"]
            self.message = str(error["message"])
            field = error.get("field")
            self.field = None if field is None else str(field)
        except (ValueError, KeyError, TypeError):
            self.message = body[:200].decode("utf-8", "replace") or "(no body)"
        self.value: Any = None
        found = _lookup(sent, self.field) if self.field is not None else _MISSING
        if found is not _MISSING:
            self.value = found
        else:
            got = _GOT.search(self.message.split("\n")[0])
            if got is not None:
                try:
                    self.value = json.loads(got.group(1))
                except ValueError:
                    self.value = got.group(1)
        where = " (field: %s)" % self.field if self.field else ""
        super().__init__("%s %s: HTTP %d: %s%s" % (method, path, status, self.message, where))


def _lookup(sent: Any, field: str) -> Any:
    """The value at a dotted field path (``tasks.2.digest``) of the JSON sent, or _MISSING."""
    if not isinstance(sent, (dict, list)) or field in ("body", ""):
        return _MISSING
    node: Any = sent
    for part in field.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


class StreamError(FleetError):
    """The result stream could not be (re)opened: every try in a row failed."""
