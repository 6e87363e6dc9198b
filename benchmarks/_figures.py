"""Saving a benchmark's matplotlib figure atomically (temp file, then rename)."""

import io
import os

from ssl_rec._io import atomic_write_bytes


def save_figure(fig: object, path: str | os.PathLike[str], dpi: int = 100) -> None:
    """Render ``fig`` as PNG into memory, write it to ``path`` atomically and close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
