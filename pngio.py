"""
pngio.py: minimal PNG reading and writing with zlib + struct, so the image-folder loader of
vit_train.py, the pictures of vit_inspect.py, and LRA's Pathfinder generator and loaders need
no imaging library. Reading uses Pillow when it is installed (faster);
this decoder is the fallback and handles what LRA's files use: non-interlaced PNGs of any
colour type at bit depths 1-16, all five row filters.

    from pngio import encode_png, decode_png, to_grey
    data = encode_png(pixels)          # pixels: uint8 (H, W) grey or (H, W, 3) RGB
    img = decode_png(data)             # -> (H, W, C) uint8 (uint16 for 16-bit files)
"""

import io
import struct
import zlib

import numpy as np

try:  # optional: much faster decoding
    from PIL import Image as _PILImage
except ImportError:  # pragma: no cover - depends on the environment
    _PILImage = None

SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel
GREY_WEIGHTS = (0.2989, 0.5870, 0.1140)  # ITU-R 601 luma, as tf.image.rgb_to_grayscale


def _chunk(kind, payload):
    crc = zlib.crc32(kind + payload) & 0xFFFFFFFF
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)


def encode_png(pixels):
    """PNG bytes of an 8-bit image: uint8 (H, W) grey or (H, W, 3) RGB. Rows unfiltered."""
    pixels = np.asarray(pixels)
    if pixels.dtype != np.uint8 or pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] != 3):
        raise ValueError(f"encode_png takes uint8 (H, W) or (H, W, 3), got {pixels.dtype} {pixels.shape}")
    H, W = pixels.shape[:2]
    colour_type = 0 if pixels.ndim == 2 else 2
    rows = pixels.reshape(H, -1)  # (H, W * C)
    raw = np.concatenate([np.zeros((H, 1), np.uint8), rows], axis=1).tobytes()  # filter byte 0 per row
    header = struct.pack(">IIBBBBB", W, H, 8, colour_type, 0, 0, 0)
    return SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw, 9)) + _chunk(b"IEND", b"")


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(data, H, row_bytes, bpp):
    """Undo the per-row filters (PNG spec §9): data holds H rows of 1 + row_bytes bytes."""
    out = np.zeros((H, row_bytes), np.uint8)
    prev = np.zeros(row_bytes, np.uint8)
    for y in range(H):
        start = y * (row_bytes + 1)
        kind = data[start]
        row = np.frombuffer(data, np.uint8, row_bytes, start + 1)
        if kind == 0:  # None
            cur = row.copy()
        elif kind == 1:  # Sub: add the byte bpp to the left (a running sum per channel)
            cur = np.cumsum(row.reshape(-1, bpp), axis=0, dtype=np.uint8).reshape(-1)
        elif kind == 2:  # Up: add the byte above
            cur = row + prev
        elif kind in (3, 4):  # Average / Paeth: depend on the reconstructed left byte
            cur = bytearray(row_bytes)
            r, up = row.tolist(), prev.tolist()
            for i in range(row_bytes):
                left = cur[i - bpp] if i >= bpp else 0
                upleft = up[i - bpp] if i >= bpp else 0
                pred = (left + up[i]) // 2 if kind == 3 else _paeth(left, up[i], upleft)
                cur[i] = (r[i] + pred) & 0xFF
            cur = np.frombuffer(bytes(cur), np.uint8)
        else:
            raise ValueError(f"corrupt PNG: unknown row filter {kind} in row {y}")
        out[y] = cur
        prev = out[y]
    return out


def _decode_own(data):
    if data[:8] != SIGNATURE:
        raise ValueError("not a PNG file (bad signature)")
    pos, idat, palette, header = 8, [], None, None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        payload = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + payload) & 0xFFFFFFFF != crc:
            raise ValueError(f"corrupt PNG: CRC mismatch in chunk {kind!r}")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", payload)
        elif kind == b"PLTE":
            palette = np.frombuffer(payload, np.uint8).reshape(-1, 3)
        elif kind == b"IDAT":
            idat.append(payload)
        elif kind == b"IEND":
            break
        pos += 12 + length
    if header is None:
        raise ValueError("corrupt PNG: no IHDR chunk")
    W, H, depth, colour_type, _, _, interlace = header
    if interlace:
        raise ValueError("interlaced PNGs are not supported by the built-in decoder; pip install Pillow")
    channels = CHANNELS[colour_type]
    bits_per_pixel = channels * depth
    row_bytes = (W * bits_per_pixel + 7) // 8
    raw = zlib.decompress(b"".join(idat))
    rows = _unfilter(raw, H, row_bytes, max(1, bits_per_pixel // 8))  # (H, row_bytes)
    if depth == 16:
        img = rows.view(">u2").astype(np.uint16).reshape(H, W, channels)
    elif depth == 8:
        img = rows.reshape(H, W, channels)
    else:  # 1, 2, 4 bits: unpack, keep W samples per row
        bits = np.unpackbits(rows, axis=1).reshape(H, -1, depth)  # (H, row_bytes * 8 / depth, depth)
        values = (bits * (1 << np.arange(depth - 1, -1, -1, dtype=np.uint8))).sum(-1)[:, :W]
        if colour_type == 0:  # scale grey to 0..255
            values = values * (255 // ((1 << depth) - 1))
        img = values.astype(np.uint8)[..., None]
    if colour_type == 3:  # palette index -> RGB
        if palette is None:
            raise ValueError("corrupt PNG: palette image without a PLTE chunk")
        img = palette[img[..., 0]]
    return img


def decode_png(data, use_pil=True):
    """PNG bytes -> (H, W, C) array (uint8, or uint16 for 16-bit files; palettes expanded).
    Uses Pillow when installed and use_pil is True, else the decoder above."""
    if use_pil and _PILImage is not None:
        im = _PILImage.open(io.BytesIO(data))
        if im.mode in ("P", "PA", "1"):  # palette and 1-bit images: expand like the fallback does
            im = im.convert("RGB" if im.mode == "P" else "RGBA" if im.mode == "PA" else "L")
        img = np.asarray(im)
        return img[..., None] if img.ndim == 2 else img
    return _decode_own(data)


def to_grey(img):
    """(H, W, C) -> (H, W) uint8: luma of RGB(A), alpha dropped, 16 bits scaled down."""
    img = np.asarray(img)
    if img.dtype == np.uint16:
        img = (img >> 8).astype(np.uint8)
    if img.ndim == 2:
        return img.astype(np.uint8)
    if img.shape[2] in (1, 2):  # grey (+ alpha)
        return img[..., 0].astype(np.uint8)
    rgb = img[..., :3].astype(np.float32)
    grey = rgb @ np.asarray(GREY_WEIGHTS, np.float32)
    return np.clip(np.rint(grey), 0, 255).astype(np.uint8)
