"""The entry compression codecs: the same stream formats Pulsar's codecs read and write.

Role: ``encode.py`` compresses a batch payload once per entry, ``decode.py`` decompresses it
once per read. NONE, LZ4 (raw block), ZLIB, ZSTD (level 3, Pulsar's) and SNAPPY (raw). A
compressed entry records its uncompressed size; decompression checks it (``CorruptEntry`` on
any mismatch) and refuses sizes above ``UNCOMPRESSED_BYTES_MAX`` before allocating.
"""

from __future__ import annotations

import enum
import threading
import zlib

import cramjam
import lz4.block
import zstandard

from broker.entry_format.wire import read_varint
from broker.errors import CorruptEntry, InvalidRequest
from broker.limits import UNCOMPRESSED_BYTES_MAX

ZSTD_LEVEL = 3  # Pulsar's CompressionCodecZstd level

class Compression(enum.IntEnum):
    """Pulsar's ``CompressionType``; values are the wire values."""

    NONE = 0
    LZ4 = 1
    ZLIB = 2
    ZSTD = 3
    SNAPPY = 4

    @classmethod
    def parse(cls, name: str) -> Compression:
        """Case-insensitive name (Pulsar's ``compressionType`` parameter values)."""
        try:
            return cls[name.strip().upper()]
        except (KeyError, AttributeError):
            choices = ", ".join(c.name for c in cls)
            raise InvalidRequest(f"unknown compression type {name!r}; expected one of {choices}") from None

COMPRESSIONS = tuple(Compression)

_zstd_local = threading.local()

def _zstd_compressor() -> zstandard.ZstdCompressor:
    compressor: zstandard.ZstdCompressor | None = getattr(_zstd_local, "compressor", None)
    if compressor is None:
        compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
        _zstd_local.compressor = compressor
    return compressor

def _zstd_decompressor() -> zstandard.ZstdDecompressor:
    decompressor: zstandard.ZstdDecompressor | None = getattr(_zstd_local, "decompressor", None)
    if decompressor is None:
        decompressor = zstandard.ZstdDecompressor()
        _zstd_local.decompressor = decompressor
    return decompressor

def _zlib_compress(data: bytes) -> bytes:
    # Pulsar's CompressionCodecZLib: java.util.zip.Deflater at the default level, drained with
    # SYNC_FLUSH (no final block); empty input produces no bytes at all.
    if not data:
        return b""
    compressor = zlib.compressobj()
    return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)

def compress(compression: Compression, data: bytes) -> bytes:
    if compression is Compression.NONE:
        return data
    out: bytes
    if compression is Compression.LZ4:
        out = lz4.block.compress(data, store_size=False)
    elif compression is Compression.ZLIB:
        out = _zlib_compress(data)
    elif compression is Compression.ZSTD:
        out = _zstd_compressor().compress(data)
    else:
        out = bytes(cramjam.snappy.compress_raw(data))
    return out

def _decompress_raw(compression: Compression, data: memoryview, size: int) -> bytes:
    out: bytes
    if compression is Compression.LZ4:
        out = lz4.block.decompress(data, uncompressed_size=size)
    elif compression is Compression.ZLIB:
        out = zlib.decompressobj().decompress(data, size + 1)
    elif compression is Compression.ZSTD:
        # A frame that declares its content size is decompressed to that size whatever
        # max_output_size says, so the declaration is checked first (no huge allocations).
        declared = zstandard.frame_content_size(data)
        if declared not in (-1, size):
            raise CorruptEntry(f"ZSTD frame declares {declared} bytes, metadata says {size}")
        out = _zstd_decompressor().decompress(data, max_output_size=size)
    else:
        raw = bytes(data)
        declared = read_varint(raw, 0)[0]  # raw snappy starts with the uncompressed length
        if declared != size:
            raise CorruptEntry(f"SNAPPY block declares {declared} bytes, metadata says {size}")
        out = bytes(cramjam.snappy.decompress_raw(raw))
    return out

def decompress(compression: Compression, data: memoryview, size: int) -> bytes:
    if size > UNCOMPRESSED_BYTES_MAX:
        raise CorruptEntry(f"entry declares an uncompressed size of {size} bytes, over the limit")
    try:
        out = _decompress_raw(compression, data, size)
    except (lz4.block.LZ4BlockError, zlib.error, zstandard.ZstdError, cramjam.DecompressionError, IndexError) as exc:
        raise CorruptEntry(f"{compression.name} payload does not decompress: {exc}") from None
    if len(out) != size:
        raise CorruptEntry(f"{compression.name} payload decompressed to {len(out)} bytes, metadata says {size}")
    return out
