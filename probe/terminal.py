"""Untrusted text made safe to print: control characters shown escaped, never sent to the terminal raw.

Model replies, dilemma texts, file names and anything read from a run folder
are untrusted (run folders travel between people). A terminal acts on the
control characters in what it prints: ``ESC [ 1 A`` moves the cursor up,
``ESC [ 2 K`` erases a line (so a reply can overwrite and fake the lines above
it), an OSC sequence sets the window title or, with OSC 52, the clipboard; a
lone C1 character (U+009B is CSI) does the same on terminals that honour it.
Chunk receipts catch damage, not tampering, so the text itself is treated as
hostile where it is printed: every C0 control but newline and tab, DEL and
every C1 control is shown as a visible escape (``\\x1b``), the way ``repr``
writes it.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""C0 controls except tab (0x09) and newline (0x0a), DEL, and the C1 controls."""
_CONTROL_IN_JSON = re.compile(r"[\x7f-\x9f]")
"""What ``json.dumps(..., ensure_ascii=False)`` leaves raw (it escapes C0 itself)."""


def escape_controls(text: str) -> str:
    """``text`` with every control character but newline and tab written as ``\\xHH`` (visible, inert)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def escape_controls_json(text: str) -> str:
    """A JSON document (from ``json.dumps(..., ensure_ascii=False)``) with DEL and the C1 controls written as
    ``\\u00HH``: the same JSON value, and nothing a terminal acts on (C0 controls are escaped by ``json.dumps``)."""
    return _CONTROL_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
