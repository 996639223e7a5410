"""Offline tokenizers: an HF snapshot's `tokenizer.json`, or a small byte-level BPE trained
locally on the synthetic corpus for the built-in default.

Special token ids are always looked up in the tokenizer, never hard-coded. The locally
trained tokenizer appends the Qwen special tokens in Qwen's own order after its BPE
vocabulary, so with a 900-token BPE they land at `real_id - 151643 + 900` (the tiny model's
convention in docs/model.md, "The tiny model and the built-in tokenizer").
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Sequence

# Qwen3 / Qwen3-VL added tokens, in id order starting at 151643.
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
# Tokens that are "special" (skipped when decoding with skip_special_tokens); the tool and
# think tags stay visible text, as in Qwen's tokenizer.
_TEXT_LIKE = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}


class TokenizerError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    pad: int
    im_start: int
    im_end: int
    vision_start: int
    vision_end: int
    image_pad: int
    video_pad: int
    tool_call: int
    tool_call_end: int
    tool_response: int
    tool_response_end: int
    think: int
    think_end: int

    @property
    def structural(self) -> tuple[int, ...]:
        return (self.think, self.think_end, self.tool_call, self.tool_call_end)


_SPECIAL_FIELDS = {
    "pad": "<|endoftext|>", "im_start": "<|im_start|>", "im_end": "<|im_end|>",
    "vision_start": "<|vision_start|>", "vision_end": "<|vision_end|>",
    "image_pad": "<|image_pad|>", "video_pad": "<|video_pad|>", "tool_call": "<tool_call>",
    "tool_call_end": "</tool_call>", "tool_response": "<tool_response>",
    "tool_response_end": "</tool_response>", "think": "<think>", "think_end": "</think>",
}


class Tokenizer:
    """Thin wrapper over `tokenizers.Tokenizer` with the ids the prompt builder needs."""

    def __init__(self, backend, source: str = "<memory>"):
        self.backend = backend
        self.source = source
        self.special = SpecialIds(**{field: self.token_id(token) for field, token in _SPECIAL_FIELDS.items()})

    @classmethod
    def from_directory(cls, directory: str) -> Tokenizer:
        from tokenizers import Tokenizer as Backend

        path = os.path.join(directory, "tokenizer.json")
        if not os.path.isfile(path):
            raise TokenizerError(f"{path}: no tokenizer.json in the snapshot directory")
        try:
            backend = Backend.from_file(path)
        except Exception as e:
            raise TokenizerError(f"{path}: cannot load tokenizer ({e})") from e
        return cls(backend, source=path)

    def token_id(self, token: str) -> int:
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise TokenizerError(f"{self.source}: tokenizer has no token {token!r}")
        return int(token_id)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.backend.save(os.path.join(directory, "tokenizer.json"))
        # PreTrainedTokenizerFast: transformers tokenizes as tokenizer.json says (Qwen2Tokenizer
        # would replace its pre-tokenizer with Qwen's own, which splits digits apart, and the
        # built-in BPEs split otherwise)
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 262144,
                  "pad_token": "<|endoftext|>", "eos_token": "<|im_end|>", "add_bos_token": False}
        with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
            json.dump(config, f, indent=2)


PRE_SPLITS = ("words", "json", "digits")


def train_tokenizer(corpus: Iterable[str], bpe_vocab_size: int = 900, split: str = "words",
                    apart: Sequence[str] = ()) -> Tokenizer:
    """A byte-level BPE with exactly `bpe_vocab_size` regular tokens, then the Qwen specials.

    split: what merges may not cross. "words": the GPT-2 pattern (words, numbers and
    punctuation runs apart; Qwen's way). "json": words (letters and underscores, with one
    leading space) and digit runs stand apart, while the punctuation and spacing between them
    may merge, so the tool-call JSON's skeleton (`", "start_time": `) costs a few tokens and the
    words and numbers a call copies from the prompt are the same tokens wherever they occur.
    "digits": only digit runs and newlines stand apart; everything else may merge across words,
    so text the corpus repeats (a task's system prompt, its templates) shrinks to a few tokens
    while a number stays the same token wherever it occurs, and a prompt that ends in a newline
    (the rollouts' "<think>\n" prefix) splits where the training text does. With "json" and
    "digits", the corpus is cut at the special tokens first (the encoder never merges across
    them).

    apart ("json" and "digits"): words that always stand apart, as single tokens (no leading
    space): the same token wherever the word occurs, so text that names them (a question's
    subject, a summary, an answer) can be copied and matched token for token."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as Backend

    if split not in PRE_SPLITS:
        raise TokenizerError(f"tokenizer split {split!r}: expected one of {PRE_SPLITS}")
    bad = [w for w in apart if not re.fullmatch(r"[A-Za-z]+", w)]
    if bad or (apart and split == "words"):
        raise TokenizerError(f"tokenizer apart words {list(apart)!r}: letters only, with split json or digits"
                             + (f" (not {bad})" if bad else ""))
    backend = Backend(models.BPE())
    if split == "words":
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        pattern = r"\d+| ?[A-Za-z_]+" if split == "json" else r"\d+|\n"
        if apart:  # longest first, whole words only
            words = "|".join(sorted(map(re.escape, apart), key=len, reverse=True))
            pattern = rf"(?<![A-Za-z])(?:{words})(?![A-Za-z])|" + pattern
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        specials = re.compile("|".join(re.escape(t) for t in QWEN_SPECIAL_TOKENS))
        corpus = [piece for text in corpus for piece in specials.split(text) if piece]
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=bpe_vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    backend.train_from_iterator(list(corpus), trainer=trainer)
    regular = backend.get_vocab_size(with_added_tokens=True)
    if regular > bpe_vocab_size:
        raise TokenizerError(f"BPE produced {regular} tokens > requested {bpe_vocab_size}")
    # Pad the regular vocabulary to exactly bpe_vocab_size so the specials land at fixed ids.
    if regular < bpe_vocab_size:
        backend.add_tokens([f"<|unused_{i}|>" for i in range(bpe_vocab_size - regular)])
    backend.add_special_tokens([AddedToken(t, special=t not in _TEXT_LIKE, normalized=False)
                                for t in QWEN_SPECIAL_TOKENS])
    return Tokenizer(backend)
