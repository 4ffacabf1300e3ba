"""Renders the installable dashboard's PNG icons (icon-192.png, icon-512.png) from the
same drawing as icon.svg: a blue rounded square with a white check mark. Full-bleed
(the square fills the image), so the icons also serve as `maskable`. Pure Python (zlib),
so anyone can re-render them: python3 make-icons.py
"""

import math
import struct
import zlib

BLUE = (0x1F, 0x4F, 0xD1)
WHITE = (0xFF, 0xFF, 0xFF)
# The check mark of icon.svg, in its 32x32 box: M9 16.5 L13.5 21 L23 11, width 3.2.
CHECK = [(9.0, 16.5), (13.5, 21.0), (23.0, 11.0)]
WIDTH = 3.2


def segment_distance(px, py, ax, ay, bx, by):
    dx, dy = bx - ax, by - ay
    t = max(0.0, min(1.0, ((px - ax) * dx + (py - ay) * dy) / (dx * dx + dy * dy)))
    return math.hypot(px - (ax + t * dx), py - (ay + t * dy))


def render(size):
    scale = 32.0 / size
    rows = []
    for y in range(size):
        row = bytearray([0])  # filter: none
        for x in range(size):
            # Sample the pixel's centre, with 4x4 supersampling for smooth edges.
            coverage = 0
            for sy in range(4):
                for sx in range(4):
                    px = (x + (sx + 0.5) / 4) * scale
                    py = (y + (sy + 0.5) / 4) * scale
                    d = min(
                        segment_distance(px, py, *CHECK[i], *CHECK[i + 1])
                        for i in range(len(CHECK) - 1)
                    )
                    coverage += d <= WIDTH / 2
            a = coverage / 16
            row += bytes(round(BLUE[c] * (1 - a) + WHITE[c] * a) for c in range(3))
        rows.append(bytes(row))
    raw = b"".join(rows)

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


if __name__ == "__main__":
    for size in (192, 512):
        with open(f"icon-{size}.png", "wb") as f:
            f.write(render(size))
