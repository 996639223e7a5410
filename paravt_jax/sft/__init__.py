"""Cold-start SFT."""
