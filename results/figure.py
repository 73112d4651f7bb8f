"""
The PNG file of a figure results/render.py draws (a module's FIGURES: results/efficiency.png):
the picture, and in its PNG text the points it was drawn from and a digest of its pixels. So
`python results/render.py --check` tells, with Pillow and without drawing anything, a figure
drawn from other points than its JSON's, a file damaged or cut short, and another picture put
in its place. The same points drawn by the same matplotlib give the same bytes: the file holds
no date and no software version.

    png_bytes(fig, points, dpi)    # a matplotlib figure as the bytes of its PNG file
    stored_points(path)            # the points it was drawn from; None if there is no file;
                                   # Damaged(why) if the file is not the picture drawn from them
"""

import hashlib
import io
import json
import os
import zlib


POINTS, PIXELS = "Description", "Pixels-SHA256"  # the PNG text keys: the points, the digest of the pixels
IEND = b"\0\0\0\0IEND\xaeB`\x82"  # the chunk every PNG ends with, its checksum included (Pillow does not check it)


class Damaged(Exception):
    """A figure's file that is not the picture drawn from the points it holds; the text says why."""


def pixels_digest(image):
    """The sha256 of a Pillow image's size and RGBA pixels (hex)."""
    rgba = image.convert("RGBA")
    return hashlib.sha256(f"{rgba.width}x{rgba.height}\n".encode() + rgba.tobytes()).hexdigest()


def png_bytes(fig, points, dpi):
    """The matplotlib figure `fig` drawn at `dpi` as the bytes of a PNG file, with `points` (JSON
    data) and the digest of the pixels it holds (render.py writes it with the documents)."""
    import numpy as np
    from PIL import Image, PngImagePlugin
    fig.set_dpi(dpi)
    fig.canvas.draw()
    image = Image.fromarray(np.asarray(fig.canvas.buffer_rgba()), "RGBA")  # (height, width, 4) uint8
    text = PngImagePlugin.PngInfo()
    text.add_text(POINTS, json.dumps(points, sort_keys=True))
    text.add_text(PIXELS, pixels_digest(image))
    buf = io.BytesIO()
    image.save(buf, format="PNG", pnginfo=text, dpi=(dpi, dpi))
    return buf.getvalue()


def stored_points(path):
    """The points the figure at path was drawn from (None where there is no file), once its
    pixels are found to be those drawn: any other file at path is Damaged, saying why."""
    if not os.path.lexists(path):
        return None
    from PIL import Image
    try:
        with open(path, "rb") as f:
            data = f.read()
        with Image.open(io.BytesIO(data)) as image:
            image.verify()  # every chunk's checksum, up to the end of the picture
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            text, digest = dict(image.text), pixels_digest(image)
    except Image.UnidentifiedImageError:  # (its first chunks, or another kind of file)
        raise Damaged("not a PNG that Pillow can read: damaged, or another kind of file") from None
    except (OSError, SyntaxError, ValueError, EOFError, zlib.error, Image.DecompressionBombError) as e:
        raise Damaged(f"not a whole PNG, cut short or damaged: {' '.join(str(e).split())[:100]}") from None
    if not data.endswith(IEND):
        raise Damaged("its last bytes are not a PNG's end: damaged, or bytes were appended")
    if POINTS not in text or PIXELS not in text:
        raise Damaged("a picture without the points it was drawn from or their digest, which results/render.py "
                      "did not draw")
    if text[PIXELS] != digest:
        raise Damaged("its pixels are not those it was drawn with: another picture, or damaged")
    try:
        return json.loads(text[POINTS])
    except json.JSONDecodeError as e:
        raise Damaged(f"its stored points are damaged, not JSON ({e.msg})") from None
