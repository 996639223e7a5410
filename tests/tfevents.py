"""Reads TensorBoard event files back (TFRecord framing, Event and Summary protobufs) so tests can
check what `paravt_jax.metrics_writer` wrote."""
import struct

from paravt_jax.metrics_writer import crc32c, masked_crc32c, parse_event


def read_events(path: str) -> list[tuple[int, dict[str, float]]]:
    """[(step, {tag: value})] of every event in a TensorBoard event file, checking each record's CRCs."""
    out = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        assert struct.unpack("<I", data[pos + 8:pos + 12])[0] == masked_crc32c(crc32c(data[pos:pos + 8]))
        body = data[pos + 12:pos + 12 + length]
        assert struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])[0] == masked_crc32c(crc32c(body))
        pos += 16 + length
        out.append(parse_event(body))
    return out
