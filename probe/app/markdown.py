"""A small Markdown renderer for the reports probe writes (``report/summary.md``).

The reports use a narrow subset: headings, paragraphs, bullet and numbered
lists, pipe tables, block quotes, fenced code, and inline code, bold, italics,
links and images. Rendering that subset here keeps the viewer free of a
dependency and of surprises: every piece of text is HTML-escaped first, link
and image targets are passed through a callback (the viewer points relative
ones at the run's report folder and drops any other scheme than http(s)), and
table cells go through a second callback that may turn a cell into a link
(a dilemma's row opens that dilemma's trials).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Sequence

LinkFn = Callable[[str], "str | None"]
CellFn = Callable[[str, str], "str | None"]
"""(column header, cell text) -> URL of the trials behind the cell, or None."""

_CODE = re.compile(r"`([^`]+)`")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_ITALIC = re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])")
_TABLE_SEP = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_ORDERED = re.compile(r"^\d+[.)]\s+")


def _safe_url(url: str, link: LinkFn) -> str | None:
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", url):
        return url if url.startswith(("http://", "https://")) else None
    return link(url)


def inline(text: str, link: LinkFn = lambda u: u) -> str:
    """One line of Markdown as HTML (escaped; code spans are left as they are)."""
    codes: list[str] = []

    def keep_code(m: re.Match[str]) -> str:
        codes.append(f"<code>{html.escape(m.group(1), quote=False)}</code>")
        return f"\x00{len(codes) - 1}\x00"

    text = _CODE.sub(keep_code, text)
    text = html.escape(text, quote=False)

    def image(m: re.Match[str]) -> str:
        url = _safe_url(html.unescape(m.group(2)), link)
        alt = html.escape(html.unescape(m.group(1)))
        return f'<img src="{html.escape(url)}" alt="{alt}">' if url else alt

    def anchor(m: re.Match[str]) -> str:
        url = _safe_url(html.unescape(m.group(2)), link)
        return f'<a href="{html.escape(url)}">{m.group(1)}</a>' if url else m.group(1)

    text = _IMAGE.sub(image, text)
    text = _LINK.sub(anchor, text)
    text = _BOLD.sub(r"<strong>\1</strong>", text)
    text = _ITALIC.sub(r"<em>\1</em>", text)
    return re.sub("\x00(\\d+)\x00", lambda m: codes[int(m.group(1))], text)


def _cells(line: str) -> list[str]:
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)]


def table(header: Sequence[str], rows: Sequence[Sequence[str]], link: LinkFn, cell: CellFn | None) -> str:
    """A sortable, filterable HTML table; a cell that ``cell`` maps to a URL becomes a link to those trials."""
    out = ['<table class="report sortable filterable">', "<thead><tr>"]
    out += [f"<th>{inline(h, link)}</th>" for h in header]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>")
        for i, value in enumerate(row):
            body = inline(value, link)
            url = cell(header[i] if i < len(header) else "", value) if cell else None
            if url:
                body = f'<a class="trials-link" href="{html.escape(url)}">{body}</a>'
            out.append(f"<td>{body}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def render(text: str, link: LinkFn = lambda u: u, cell: CellFn | None = None) -> str:
    """``text`` (Markdown) as an HTML fragment."""
    lines = text.splitlines()
    out: list[str] = []
    para: list[str] = []
    i = 0

    def flush() -> None:
        if para:
            out.append("<p>" + " ".join(inline(p, link) for p in para) + "</p>")
            para.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            flush()
            i += 1
        elif stripped.startswith("```"):
            flush()
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i])
                i += 1
            out.append("<pre><code>" + html.escape("\n".join(body), quote=False) + "</code></pre>")
            i += 1
        elif m := re.match(r"^(#{1,6})\s+(.*)$", stripped):
            flush()
            level = len(m.group(1))
            out.append(f"<h{level}>{inline(m.group(2), link)}</h{level}>")
            i += 1
        elif stripped.startswith("|") and i + 1 < len(lines) and _TABLE_SEP.match(lines[i + 1].strip()):
            flush()
            header = _cells(stripped)
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out.append(table(header, rows, link, cell))
        elif stripped.startswith(">"):
            flush()
            quoted = []
            while i < len(lines) and lines[i].strip().startswith(">"):
                quoted.append(lines[i].strip()[1:].lstrip())
                i += 1
            out.append("<blockquote>" + render("\n".join(quoted), link, cell) + "</blockquote>")
        elif re.match(r"^[-*+]\s+", stripped) or _ORDERED.match(stripped):
            flush()
            ordered = bool(_ORDERED.match(stripped))
            items: list[str] = []
            while i < len(lines) and lines[i].strip():
                s = lines[i].strip()
                m2 = _ORDERED.match(s) if ordered else re.match(r"^[-*+]\s+", s)
                if m2:
                    items.append(s[m2.end() :])
                elif items:
                    items[-1] += " " + s  # a continuation line of the item
                i += 1
            tag = "ol" if ordered else "ul"
            out.append(f"<{tag}>" + "".join(f"<li>{inline(it, link)}</li>" for it in items) + f"</{tag}>")
        else:
            para.append(stripped)
            i += 1
    flush()
    return "\n".join(out)
