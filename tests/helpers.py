"""Small helpers shared by the test modules (tests/ is on sys.path under pytest's default import mode)."""

from __future__ import annotations

import io
import socket

import numpy as np
from PIL import Image


def png(array: np.ndarray) -> bytes:
    """``array`` (H, W[, 3]) uint8 encoded as PNG bytes."""
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (bound then closed: nothing listens there)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
