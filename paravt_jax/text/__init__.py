"""Tokenizer, chat rendering and model inputs."""
