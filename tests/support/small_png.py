"""Screenshots small enough to keep in docs/: a browser's RGBA pixels as an 8-bit palette PNG (the 256 most
used colours; every other colour, the anti-aliased edges of text, as its nearest among them). Pure Python:
no imaging library in the test extra. A page of text goes from about 200 KB to under 100 KB, looking alike.
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter

# A page's screenshot (PNG bytes, base64) read back as RGBA pixels through a canvas: run on a blank page.
RGBA_OF_PNG_JS = """async (src) => {
    const img = new Image();
    img.src = 'data:image/png;base64,' + src;
    await img.decode();
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    const g = c.getContext('2d');
    g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    let s = '';
    for (let i = 0; i < d.length; i += 0x8000) s += String.fromCharCode.apply(null, d.subarray(i, i + 0x8000));
    return {width: c.width, height: c.height, rgba: btoa(s)};
}"""


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def palette_png(rgba: bytes, width: int, height: int, colors: int = 256) -> bytes:
    """An opaque image's RGBA bytes (row by row) as a palette PNG of at most `colors` colours."""
    assert len(rgba) == width * height * 4, (len(rgba), width, height)
    pixels = memoryview(rgba).cast("I")  # one int per pixel (alpha ignored: screenshots are opaque)
    counts = Counter(pixels)
    palette = [c for c, _ in counts.most_common(colors)]

    def rgb(c: int) -> tuple[int, int, int]:
        return (c >> 0) & 255, (c >> 8) & 255, (c >> 16) & 255  # memory order R, G, B, A: little-endian ints

    shades = [rgb(c) for c in palette]
    index = {c: i for i, c in enumerate(palette)}
    for c in counts:
        if c not in index:
            r, g, b = rgb(c)
            index[c] = min(range(len(shades)), key=lambda i: (shades[i][0] - r) ** 2 + (shades[i][1] - g) ** 2
                           + (shades[i][2] - b) ** 2)
    flat = bytes(index[p] for p in pixels)
    rows = b"".join(b"\0" + flat[y * width:(y + 1) * width] for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0))
            + _chunk(b"PLTE", b"".join(bytes(s) for s in shades)) + _chunk(b"IDAT", zlib.compress(rows, 9))
            + _chunk(b"IEND", b""))
