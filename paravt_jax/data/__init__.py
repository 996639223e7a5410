"""Data: the built-in synthetic sets and toy task, the reference parquet schemas, TFDS builders,
SFT examples and the overview-frame draw (nFrames gating)."""
