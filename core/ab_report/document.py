"""A report as a list of blocks (headings, paragraphs, tables, images), written out twice: as
Markdown (`to_markdown`) and as a self-contained HTML page (`to_html`, the images linked beside it).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Paragraph:
    text: str


@dataclass
class Table:
    """A table: `header` cells, then `rows` of cells (strings); the first column is the row label."""

    header: list[str]
    rows: list[list[str]] = field(default_factory=list)


@dataclass
class Image:
    """A PNG beside the report: `path` relative to the report's folder."""

    path: str
    caption: str


Block = Heading | Paragraph | Table | Image


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list[Block]) -> str:
    """The report as GitHub-flavoured Markdown."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"{'#' * b.level} {b.text}")
        elif isinstance(b, Paragraph):
            out.append(b.text)
        elif isinstance(b, Table):
            out.append("| " + " | ".join(_md_cell(h) for h in b.header) + " |")
            out.append("|" + "|".join([" --- "] + [" ---: "] * (len(b.header) - 1)) + "|")
            out.extend("| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows)
        elif isinstance(b, Image):
            out.append(f"![{b.caption}]({b.path})\n\n*{b.caption}*")
        out.append("")
    return "\n".join(out)


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 70em; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f3f3f3; }
figure { margin: 1.5em 0; } figcaption { font-style: italic; color: #555; }
img { max-width: 100%; }
.warning { background: #fff4d6; border-left: 4px solid #e0a800; padding: 0.5em 1em; }
"""


def to_html(blocks: list[Block], title: str) -> str:
    """The report as one HTML page (images by relative path)."""
    e = html.escape
    out = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">", f"<title>{e(title)}</title>",
           f"<style>{STYLE}</style></head><body>"]
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"<h{b.level}>{e(b.text)}</h{b.level}>")
        elif isinstance(b, Paragraph):
            cls = ' class="warning"' if b.text.startswith("warning:") else ""
            out.append(f"<p{cls}>{e(b.text)}</p>")
        elif isinstance(b, Table):
            out.append("<table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in b.header) + "</tr></thead><tbody>")
            out.extend("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in b.rows)
            out.append("</tbody></table>")
        elif isinstance(b, Image):
            out.append(f'<figure><img src="{e(b.path)}" alt="{e(b.caption)}"><figcaption>{e(b.caption)}</figcaption></figure>')
    out.append("</body></html>")
    return "\n".join(out) + "\n"
