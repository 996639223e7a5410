"""Reads TensorBoard event files back so tests can check what `paravt_jax.infra.metrics_writer` wrote."""
from paravt_jax.infra.metrics_writer import event_records, parse_event


def read_events(path: str) -> list[tuple[int, dict[str, float]]]:
    """[(step, {tag: value})] of every event in a TensorBoard event file; fails unless every
    record is whole and passes its CRCs."""
    with open(path, "rb") as f:
        data = f.read()
    records = list(event_records(data))
    assert (records[-1][1] if records else 0) == len(data), f"{path}: a torn or corrupt record"
    return [parse_event(body) for _, _, body in records]
