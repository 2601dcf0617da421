"""A page of 50 images for a browser to load, and the check of its screenshot.

Usage: grid.py make DIR        writes DIR/grid.html and DIR/img/0.png .. 49.png
       grid.py check PNG       exits 0 if the screenshot shows every image where it goes

Each image is a 40x40 square of its own colour, laid out 10 to a row at 50 px steps from
the page's top left corner (no margins), so that the screenshot's pixel at each cell's
centre must be that image's colour: an image missing, late or wrong shows as white or as
another colour. PNGs are written and read with zlib alone (no imaging library needed).
"""

import struct
import sys
import zlib
from pathlib import Path

COUNT, PER_ROW, STEP, SIZE = 50, 10, 50, 40


def colour(i):
    # Distinct, far from white and from each other.
    return ((i * 67) % 200 + 20, (i * 131) % 200 + 20, (i * 29) % 200 + 20)


def png(width, height, rgb):
    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def make(directory):
    d = Path(directory)
    (d / "img").mkdir(parents=True, exist_ok=True)
    cells = []
    for i in range(COUNT):
        (d / "img" / f"{i}.png").write_bytes(png(SIZE, SIZE, colour(i)))
        x, y = (i % PER_ROW) * STEP, (i // PER_ROW) * STEP
        cells.append(f'<img src="/img/{i}.png" style="position:absolute;left:{x}px;top:{y}px;width:{SIZE}px;height:{SIZE}px">')
    (d / "grid.html").write_text(
        "<!doctype html><html><head><style>html,body{margin:0;background:#fff}</style></head><body>"
        + "".join(cells) + "</body></html>")


def read_png(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), f"unexpected PNG type {depth}/{ctype}"
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev, at = [], bytearray(stride), 0
    for _ in range(height):
        f, line = raw[at], bytearray(raw[at + 1:at + 1 + stride])
        at += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[x] = (line[x] + pred) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def check(path):
    width, height, bpp, rows = read_png(path)
    wrong = []
    for i in range(COUNT):
        x = (i % PER_ROW) * STEP + SIZE // 2
        y = (i // PER_ROW) * STEP + SIZE // 2
        if x >= width or y >= height:
            wrong.append(f"{i}: outside the {width}x{height} screenshot")
            continue
        got = tuple(rows[y][x * bpp:x * bpp + 3])
        want = colour(i)
        if any(abs(g - w) > 8 for g, w in zip(got, want)):
            wrong.append(f"{i}: {got} where {want}")
    if wrong:
        print("; ".join(wrong))
        sys.exit(1)
    print(f"all {COUNT} images where they go")


if __name__ == "__main__":
    {"make": make, "check": check}[sys.argv[1]](sys.argv[2])
