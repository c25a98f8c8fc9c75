"""Participant ids: one strict pattern for every place an id reaches a path, a log line or the registry.

Used by both sides: hacfed-client's config, the key registry (`hacfed.envelope`,
`hacfed.server.membership`), the signed hello (`hacfed.hello`) and every console line that names a
participant.

**Participant ids** match `PARTICIPANT_ID_PATTERN` everywhere: 1-63 characters of lower-case
letters, digits, `-` and `_`, starting with a letter or digit. An id becomes a file name in the
registry (`<keys-dir>/<id>.pub`) and appears on console lines, so nothing else is accepted: no `/`
or `..` (path traversal), no spaces, no control characters (forged console lines), no upper case
(two ids that differ only in case would share a file on case-insensitive file systems). A text that
came from a peer and failed the check is shown only through `printable()`.
"""

from __future__ import annotations

import re

PARTICIPANT_ID_PATTERN = r"[a-z0-9][a-z0-9_-]{0,62}"
_PARTICIPANT_ID = re.compile(PARTICIPANT_ID_PATTERN)
PARTICIPANT_ID_RULE = "1-63 characters of a-z, 0-9, '-' and '_', starting with a letter or digit"


def is_participant_id(value: object) -> bool:
    return isinstance(value, str) and _PARTICIPANT_ID.fullmatch(value) is not None


def check_participant_id(value: object, what: str = "participant id") -> str:
    """`value` if it is a valid participant id, else a ValueError that shows it safely."""
    if not is_participant_id(value):
        raise ValueError(f"{what} must be {PARTICIPANT_ID_RULE}, got {printable(value)}")
    return str(value)


def printable(value: object, limit: int = 64) -> str:
    """A text from a peer, safe for one console or log line: a valid id as is, anything else as an
    ASCII-escaped quoted literal (newlines, control and bidi characters escaped), truncated."""
    if is_participant_id(value):
        return str(value)
    text = value if isinstance(value, str) else repr(value)
    shown = ascii(text[:limit])
    return shown + ("..." if len(text) > limit else "")
