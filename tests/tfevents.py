"""Reads TensorBoard event files back (TFRecord framing, Event and Summary protobufs) so tests can
check what `paravt_jax.metrics_writer` wrote."""
import struct

from paravt_jax.metrics_writer import crc32c, masked_crc32c


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
        out.append(_parse_event(body))
    return out


def _read_varint(buf, pos):
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def _parse_fields(buf):
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            length, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        yield number, value


def _parse_event(buf) -> tuple[int, dict[str, float]]:
    step, scalars = 0, {}
    for number, value in _parse_fields(buf):
        if number == 2:
            step = value
        elif number == 5:
            for _, v in _parse_fields(value):
                fields = dict(_parse_fields(v))
                scalars[fields[1].decode()] = struct.unpack("<f", fields[2])[0]
    return step, scalars
