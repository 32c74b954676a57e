"""Fixed-width text tables for the statistics and timing summaries."""

from collections.abc import Sequence

__all__ = ["table"]


def table(rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    """``rows`` (the first is the header) as aligned lines; the first ``left`` columns left."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(width) if index < left else cell.rjust(width)
            for index, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
