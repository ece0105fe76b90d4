"""The gateway's fences and the one function that keeps data from closing (or opening) one.

The gateway frames text it did not write as data between tags of its own: the summary block
(``<session_summary>``), the pinned standing instructions (``<standing_instructions>``), a summary request's transcript, previous summary and values to keep,
the proactive-recall block. Text inside one of them that spells a fence tag would end the
block early and let the rest read as fresh instructions, so every fence's data goes through
`defuse`: the ``<`` of anything that reads as one of these tags, in any case, with any spacing
or separator (``</SESSION_SUMMARY>``, ``< /session_summary >``, ``<session-summary``,
``<\u200b/session summary>``, a full-width ``＜``), is replaced by an escape that reads the same
as data and can never be a tag.
"""

from __future__ import annotations

import re

FENCES = ("session_summary", "standing_instructions", "transcript", "previous_summary", "exact_values_to_keep",
          "recalled_history")
# Space a model might read through: whitespace, zero-width characters, the BOM, and the escapes
# of white space and backslashes (``\t``, ``\\``) as JSON writes them inside the recall block.
_GAP = r"(?:[\s\u200b-\u200d\u2060\ufeff]|\\[tnrfb\\])*"
_SEPARATOR = r"[\s_\-\u200b-\u200d\u2060\ufeff]*"  # between a name's words: any of these, or none
_NAMES = "|".join(_SEPARATOR.join(map(re.escape, name.split("_"))) for name in FENCES)
# A less-than sign (ASCII, full-width or small form) that begins one of the fence tags, opening
# or closing (a slash, a backslash or a full-width slash).
_TAG = re.compile(rf"[<\uff1c\ufe64](?={_GAP}[/\\\uff0f]?{_GAP}(?:{_NAMES}))", re.IGNORECASE)


def defuse(text: str, escape: str = "&lt;") -> str:
    """`text` with the ``<`` of every fence tag in it replaced by `escape` (``&lt;`` in prose,
    ``\\u003c`` inside JSON)."""
    return _TAG.sub(lambda _: escape, text)
