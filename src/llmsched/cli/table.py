"""Plain-text tables in the box style of the rest of the CLI, without importing rich (which
costs ~45 ms of a `simulate` run's start-up) and never cut to the terminal's width."""

from __future__ import annotations


def render_table(title: str, head: tuple[str, ...], rows: list[tuple[str, ...]], right: tuple[bool, ...]) -> str:
    """`right[i]`: right-justify column i's cells (headers stay left)."""
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]

    def line(left: str, fill: str, mid: str, end: str) -> str:
        return left + mid.join(fill * (w + 2) for w in widths) + end

    def cells(values, justify) -> str:
        parts = [(str(v).rjust(w) if r else str(v).ljust(w)) for v, w, r in zip(values, widths, justify, strict=True)]
        return "│ " + " │ ".join(parts) + " │"

    width = sum(widths) + 3 * len(widths) + 1
    out = [title.center(width).rstrip()] if title else []
    out.append(line("┏", "━", "┳", "┓"))
    out.append(cells(head, right).replace("│", "┃"))
    out.append(line("┡", "━", "╇", "┩"))
    out.extend(cells(row, right) for row in rows)
    out.append(line("└", "─", "┴", "┘"))
    return "\n".join(out)
