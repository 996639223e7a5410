"""LLM-as-judge accuracy for open-ended answers (reward mode "llm").

An OpenAI-compatible chat-completions client on the standard library only. Like the
reference (`rl/rewards/llm_judge.py`) it sends ONE user message holding the question, the
ground truth and the prediction, asks whether the prediction is semantically equivalent and
wants a single number back (1.0 correct, 0.5 partially correct, 0.0 wrong), with
max_tokens 8 and temperature 0; the score is the first run of digits/dots in the reply,
read as a float and clamped to [0, 1]. A reply without such a run, or whose first run is
not a number ("1.0." or "..."), is a failure, as in the reference. Failures raise
`JudgeError`; `rewards.accuracy_reward` then falls back to token F1.

Differences from the reference: configuration comes from `LLMJudge.from_env()` (variables
PARAVT_JUDGE_BASE_URL, PARAVT_JUDGE_API_KEY, PARAVT_JUDGE_MODEL, optional
PARAVT_JUDGE_TIMEOUT_S) or the constructor, never from a module-level client; usage
counters live on the judge object; every request has a timeout; the API key never appears
in `repr()`, in log lines or in error messages (they are redacted, and errors are raised
without their chained cause); a key is optional (local servers often need none).
"""
from __future__ import annotations

import base64
import ipaddress
import json
import logging
import math
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

__all__ = ["LLMJudge", "JudgeError", "JudgeUsage", "parse_judge_reply", "judge_messages",
           "ENV_BASE_URL", "ENV_API_KEY", "ENV_MODEL", "ENV_TIMEOUT"]

log = logging.getLogger(__name__)

ENV_BASE_URL = "PARAVT_JUDGE_BASE_URL"
ENV_API_KEY = "PARAVT_JUDGE_API_KEY"
ENV_MODEL = "PARAVT_JUDGE_MODEL"
ENV_TIMEOUT = "PARAVT_JUDGE_TIMEOUT_S"

DEFAULT_BASE_URL = "https://api.openai.com/v1"  # what the OpenAI client uses when unset
DEFAULT_MODEL = "gpt-4o-mini"  # the reference's default judge model
DEFAULT_TIMEOUT_S = 30.0
MAX_REPLY_TOKENS = 8

_FIRST_NUMBER_RUN = re.compile(r"[\d.]+")


class JudgeError(RuntimeError):
    """The judge could not produce a score (HTTP error, timeout, malformed reply...)."""


def judge_messages(question: str, prediction: str, truth: str) -> list[dict[str, str]]:
    """The chat messages sent to the judge (our wording of the reference's prompt)."""
    content = (
        f"Question: {question}\n"
        f"Reference answer: {truth}\n"
        f"Candidate answer: {prediction}\n\n"
        "Does the candidate answer mean the same as the reference answer? "
        "Answer with one number only: 1.0 if it is correct, 0.5 if it is partly correct, "
        "0.0 if it is wrong."
    )
    return [{"role": "user", "content": content}]


def parse_judge_reply(reply: str) -> float:
    """Score from the judge's reply text: the first run of digits and dots, as a float,
    clamped to [0, 1] (reference semantics). Raises `JudgeError` if there is no run or the
    run is not a number."""
    found = _FIRST_NUMBER_RUN.search(reply.strip())
    if found is None:
        raise JudgeError(f"judge reply has no number: {reply[:80]!r}")
    try:
        value = float(found.group())
    except ValueError:
        raise JudgeError(f"judge reply is not a number: {reply[:80]!r}") from None
    if math.isnan(value):  # cannot come from digits/dots, kept as a guard
        raise JudgeError("judge reply is NaN")
    return min(max(value, 0.0), 1.0)


class JudgeUsage:
    """Thread-safe counters of one judge: calls (every attempt), failures, tokens reported
    by the server (prompt / completion) and summed wall-clock latency."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls = 0
        self.failures = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.latency_s = 0.0

    def record(self, *, failed: bool, latency_s: float, prompt_tokens: int = 0,
               completion_tokens: int = 0) -> None:
        with self._lock:
            self.calls += 1
            self.failures += int(failed)
            self.prompt_tokens += prompt_tokens
            self.completion_tokens += completion_tokens
            self.latency_s += latency_s

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return {"calls": self.calls, "failures": self.failures,
                    "prompt_tokens": self.prompt_tokens,
                    "completion_tokens": self.completion_tokens,
                    "latency_s": self.latency_s,
                    "mean_latency_s": self.latency_s / max(self.calls, 1)}

    def __repr__(self) -> str:
        return "JudgeUsage(" + ", ".join(f"{k}={v}" for k, v in self.snapshot().items()) + ")"


def _is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback_url(url: str) -> bool:
    """Whether a judge endpoint is on this machine (a local server may need no API key)."""
    return _is_loopback(urllib.parse.urlsplit(url).hostname)


def _token_count(usage: Any, key: str) -> int:
    if not isinstance(usage, Mapping):
        return 0
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def url_secrets(url: str) -> list[str]:
    """The parts of a URL that may hold a credential: the userinfo (user:password@) and every
    query value (?key=..., ?api-key=...)."""
    parts = urllib.parse.urlsplit(url)
    found = []
    if "@" in parts.netloc:
        userinfo = parts.netloc.rsplit("@", 1)[0]
        found += [userinfo, *userinfo.split(":", 1)]
    found += [value for _, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)]
    found += [piece.split("=", 1)[1] for piece in parts.query.split("&") if "=" in piece]  # raw (unquoted) forms
    return sorted({f for f in found if len(f) >= 4}, key=len, reverse=True)  # shorter ones are no credential


def redact_url(url: str) -> str:
    """`url` without its credentials: userinfo becomes ***@, query values ***."""
    parts = urllib.parse.urlsplit(url)
    netloc = "***@" + parts.netloc.rsplit("@", 1)[1] if "@" in parts.netloc else parts.netloc
    query = "&".join(f"{key}=***" for key, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))


class LLMJudge:
    """OpenAI-compatible chat-completions judge. `score(question, prediction, truth)`
    returns a float in [0, 1] or raises `JudgeError`; `usage` holds the counters."""

    def __init__(self, base_url: str = DEFAULT_BASE_URL, model: str = DEFAULT_MODEL,
                 api_key: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_tokens: int = MAX_REPLY_TOKENS, temperature: float = 0.0) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"judge base URL must be http(s)://host[...], got {redact_url(base_url)!r}")
        if api_key is not None and (not api_key.isprintable() or any(c.isspace() for c in api_key)):
            raise ValueError("judge API key contains whitespace or control characters")
        if not timeout_s > 0:
            raise ValueError(f"judge timeout must be > 0 s, got {timeout_s!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = float(timeout_s)
        self.max_tokens = int(max_tokens)
        self.temperature = float(temperature)
        self._api_key = api_key or None
        self._secrets = ([self._api_key] if self._api_key else []) + url_secrets(self.base_url)
        self.usage = JudgeUsage()
        # Loopback endpoints never go through an environment proxy.
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(parsed.hostname) else []
        self._opener = urllib.request.build_opener(*handlers)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> LLMJudge:
        """Build from PARAVT_JUDGE_BASE_URL (default the OpenAI API), PARAVT_JUDGE_API_KEY
        (optional), PARAVT_JUDGE_MODEL (default gpt-4o-mini) and PARAVT_JUDGE_TIMEOUT_S
        (default 30). `environ` defaults to `os.environ`; keyword overrides win."""
        env = os.environ if environ is None else environ
        kwargs: dict[str, Any] = {
            "base_url": env.get(ENV_BASE_URL) or DEFAULT_BASE_URL,
            "model": env.get(ENV_MODEL) or DEFAULT_MODEL,
            "api_key": env.get(ENV_API_KEY) or None,
        }
        if env.get(ENV_TIMEOUT):
            try:
                kwargs["timeout_s"] = float(env[ENV_TIMEOUT])
            except ValueError:
                raise ValueError(f"{ENV_TIMEOUT} must be a number of seconds") from None
        kwargs.update(overrides)
        return cls(**kwargs)

    @property
    def endpoint(self) -> str:
        """The request URL: base_url + /chat/completions, without user:password@ (sent as a
        Basic Authorization header instead, which urllib needs)."""
        parts = urllib.parse.urlsplit(self.base_url)
        path = parts.path.rstrip("/")
        path = path if path.endswith("/chat/completions") else path + "/chat/completions"
        return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1], path=path))

    def __repr__(self) -> str:
        return (f"LLMJudge(base_url={redact_url(self.base_url)!r}, model={self.model!r}, "
                f"api_key={'<set>' if self._api_key else '<unset>'}, "
                f"timeout_s={self.timeout_s})")

    __str__ = __repr__

    def __getstate__(self) -> None:  # never serialise the key by accident
        raise TypeError("LLMJudge is not picklable; rebuild it with LLMJudge.from_env()")

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        userinfo = urllib.parse.urlsplit(self.base_url).netloc.rpartition("@")[0]
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        elif userinfo:
            credentials = urllib.parse.unquote(userinfo).encode()
            headers["Authorization"] = "Basic " + base64.b64encode(credentials).decode()
        request = urllib.request.Request(self.endpoint, data=json.dumps(payload).encode("utf-8"),
                                         headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            body = exc.read(300).decode("utf-8", "replace") if exc.fp is not None else ""
            raise JudgeError(self._redact(f"judge HTTP {exc.code}: {body}")) from None
        except (TimeoutError, OSError) as exc:  # URLError, socket timeout, refused...
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError) or "timed out" in str(reason):
                raise JudgeError(f"judge request timed out after {self.timeout_s:g} s") from None
            raise JudgeError(self._redact(f"judge request failed: {reason}")) from None
        except Exception as exc:  # noqa: BLE001 - e.g. http.client errors
            message = f"judge request failed: {type(exc).__name__}: {exc}"
            raise JudgeError(self._redact(message)) from None
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            raise JudgeError(self._redact(f"judge reply is not JSON: {raw[:120]!r}")) from None
        if not isinstance(data, dict):
            raise JudgeError("judge reply is not a JSON object")
        return data

    def score(self, question: str, prediction: str, truth: str) -> float:
        """One judge call. Returns the score in [0, 1]; raises `JudgeError` on any failure
        (the failure is counted in `usage`)."""
        payload = {"model": self.model, "messages": judge_messages(question, prediction, truth),
                   "max_tokens": self.max_tokens, "temperature": self.temperature}
        start = time.monotonic()
        prompt_tokens = completion_tokens = 0
        try:
            data = self._post(payload)
            usage = data.get("usage")
            prompt_tokens = _token_count(usage, "prompt_tokens")
            completion_tokens = _token_count(usage, "completion_tokens")
            try:
                content = data["choices"][0]["message"]["content"]
            except (KeyError, IndexError, TypeError):
                raise JudgeError("judge reply has no choices[0].message.content") from None
            if not isinstance(content, str):
                raise JudgeError("judge reply content is not text")
            value = parse_judge_reply(content)
        except JudgeError as exc:
            self.usage.record(failed=True, latency_s=time.monotonic() - start,
                              prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
            log.debug("%s", self._redact(str(exc)))
            raise
        self.usage.record(failed=False, latency_s=time.monotonic() - start,
                          prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        return value

    __call__ = score
