"""LLM judge against a fake OpenAI-compatible server on 127.0.0.1 (no real network)."""
import http.server
import json
import logging
import threading
import time

import pytest

from paravt_jax.episodes.judge import JudgeError, LLMJudge, judge_messages, parse_judge_reply
from paravt_jax.episodes.rewards import accuracy_reward, compose_reward

KEY = "sk-test-SECRET-0123456789"
F1_FALLBACK = 2 / 3  # f1("cat sat", "cat sat on mat"): P = 1, R = 1/2


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep test output quiet
        pass

    def do_POST(self):
        srv = self.server
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length))
        srv.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
        behaviour = srv.behaviour
        try:
            if behaviour.get("sleep"):
                time.sleep(behaviour["sleep"])
            status = behaviour.get("status", 200)
            if "raw" in behaviour:
                payload = behaviour["raw"]
            else:
                payload = {"id": "x", "choices": [{"index": 0, "message": {
                    "role": "assistant", "content": behaviour.get("content", "1.0")}}]}
                if "usage" in behaviour:
                    payload["usage"] = behaviour["usage"]
                payload = json.dumps(payload)
            if status != 200:  # a hostile server echoing the credentials back
                payload = f"internal error; auth was {self.headers.get('Authorization')}"
            data = payload.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.requests, srv.behaviour = [], {}
    thread = threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    srv.base_url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def judge(server):
    return LLMJudge(server.base_url, "judge-model", KEY, timeout_s=5.0)


@pytest.mark.parametrize("content, expected", [
    ("1.0", 1.0), ("0.5", 0.5), ("0.0", 0.0), ("0", 0.0), ("1", 1.0),
    (" Score: 0.5\n", 0.5), ("2", 1.0),  # clamped to [0, 1]
])
def test_scores(server, judge, content, expected):
    server.behaviour = {"content": content, "usage": {"prompt_tokens": 50, "completion_tokens": 3}}
    assert judge.score("What animal?", "a feline", "cat") == expected
    assert accuracy_reward("a feline", "cat", "oe", mode="llm", judge=judge,
                           question="What animal?") == expected
    usage = judge.usage.snapshot()
    assert (usage["calls"], usage["failures"]) == (2, 0)
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (100, 6)


def test_request_shape(server, judge):
    server.behaviour = {"content": "1.0"}
    judge.score("What is he holding?", "a red cup", "red mug")
    (req,) = server.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == f"Bearer {KEY}"
    body = req["body"]
    assert body["model"] == "judge-model" and body["max_tokens"] == 8 and body["temperature"] == 0
    (msg,) = body["messages"]
    assert msg["role"] == "user"
    for part in ("What is he holding?", "a red cup", "red mug", "1.0", "0.5", "0.0"):
        assert part in msg["content"]
    assert body["messages"] == judge_messages("What is he holding?", "a red cup", "red mug")


@pytest.mark.parametrize("behaviour, match", [
    ({"status": 500}, "HTTP 500"),
    ({"raw": "this is not json"}, "not JSON"),
    ({"raw": json.dumps({"choices": []})}, "choices"),
    ({"raw": json.dumps([1, 2])}, "object"),
    ({"raw": json.dumps({"choices": [{"message": {"content": None}}]})}, "not text"),
    ({"content": "Correct"}, "no number"),
    ({"content": "Correct."}, "not a number"),  # "." is the first digit/dot run
    ({"content": "1.0."}, "not a number"),  # reference: first [\d.]+ run is "1.0." -> fails
])
def test_failures_fall_back_to_f1(server, judge, behaviour, match, caplog):
    server.behaviour = behaviour
    with pytest.raises(JudgeError, match=match) as err:
        judge.score("q", "cat sat", "cat sat on mat")
    assert KEY not in str(err.value) and err.value.__cause__ is None
    with caplog.at_level(logging.DEBUG):
        got = accuracy_reward("cat sat", "cat sat on mat", "oe", mode="llm", judge=judge)
    assert got == pytest.approx(F1_FALLBACK)
    assert KEY not in caplog.text
    assert judge.usage.snapshot()["failures"] == 2


def test_http_error_body_is_redacted(server, judge):
    server.behaviour = {"status": 500}
    with pytest.raises(JudgeError) as err:
        judge.score("q", "p", "t")
    assert "Bearer ***" in str(err.value) and KEY not in str(err.value)


def test_timeout_falls_back(server):
    server.behaviour = {"sleep": 1.0}
    judge = LLMJudge(server.base_url, "m", KEY, timeout_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(JudgeError, match="timed out"):
        judge.score("q", "cat sat", "cat sat on mat")
    assert accuracy_reward("cat sat", "cat sat on mat", "oe", mode="llm",
                           judge=judge) == pytest.approx(F1_FALLBACK)
    assert time.monotonic() - t0 < 1.9
    assert judge.usage.snapshot()["failures"] == 2


def test_connection_refused_falls_back():
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    port = srv.server_address[1]
    srv.server_close()  # nothing listens there any more
    judge = LLMJudge(f"http://127.0.0.1:{port}/v1", "m", KEY, timeout_s=2.0)
    with pytest.raises(JudgeError) as err:
        judge.score("q", "p", "t")
    assert KEY not in str(err.value)
    assert accuracy_reward("cat sat", "cat sat on mat", "oe", mode="llm",
                           judge=judge) == pytest.approx(F1_FALLBACK)


def test_compose_with_judge(server, judge):
    server.behaviour = {"content": "0.5"}
    total, parts = compose_reward("<answer>a feline</answer>", "cat", "oe", answer_suffix=True,
                                  anchor_weight=0.5, format_weight=1.0, mode="llm", judge=judge,
                                  question="What animal?")
    assert parts["acc_reward"] == 0.5 and parts["format_reward"] == pytest.approx(0.6)
    assert total == pytest.approx(1.1)
    assert server.requests[0]["body"]["messages"][0]["content"].startswith("Question: What animal?")


def test_from_env_and_secrecy(server):
    env = {"PARAVT_JUDGE_BASE_URL": server.base_url + "/", "PARAVT_JUDGE_API_KEY": KEY,
           "PARAVT_JUDGE_MODEL": "m2", "PARAVT_JUDGE_TIMEOUT_S": "3"}
    judge = LLMJudge.from_env(env)
    assert judge.model == "m2" and judge.timeout_s == 3.0
    assert judge.endpoint == server.base_url + "/chat/completions"
    for text in (repr(judge), str(judge), repr(judge.usage)):
        assert KEY not in text
    assert "<set>" in repr(judge)
    with pytest.raises(TypeError):
        __import__("pickle").dumps(judge)
    server.behaviour = {"content": "1"}
    assert judge.score("q", "p", "t") == 1.0

    # no key: no Authorization header
    anon = LLMJudge.from_env({"PARAVT_JUDGE_BASE_URL": server.base_url})
    assert anon.model == "gpt-4o-mini" and "<unset>" in repr(anon)
    anon.score("q", "p", "t")
    assert "Authorization" not in server.requests[-1]["headers"]

    # defaults: the OpenAI endpoint (no request is made here)
    assert LLMJudge.from_env({}).endpoint == "https://api.openai.com/v1/chat/completions"


def test_bad_config_errors_hide_key():
    with pytest.raises(ValueError) as err:
        LLMJudge("http://127.0.0.1:1/v1", "m", KEY + "\nX-Evil: 1")
    assert KEY not in str(err.value)
    with pytest.raises(ValueError):
        LLMJudge("ftp://example/v1")
    with pytest.raises(ValueError):
        LLMJudge("http://127.0.0.1:1/v1", timeout_s=0)
    with pytest.raises(ValueError):
        LLMJudge.from_env({"PARAVT_JUDGE_TIMEOUT_S": "soon"})


@pytest.mark.parametrize("reply, expected", [
    ("1.0", 1.0), ("0.5", 0.5), ("0", 0.0), ("The score is 0.5", 0.5), ("1.0 (correct)", 1.0),
    ("9" * 400, 1.0),
])
def test_parse_judge_reply(reply, expected):
    assert parse_judge_reply(reply) == expected


@pytest.mark.parametrize("reply", ["", "wrong", ".", "1.2.3", "..5"])
def test_parse_judge_reply_failures(reply):
    with pytest.raises(JudgeError):
        parse_judge_reply(reply)


def test_a_key_in_the_base_url_never_shows(server):
    """Keys passed in the URL (user:key@host, ?key=...) are hidden from repr, str, errors and
    bad-URL messages; the request still goes to the real URL."""
    url = server.base_url.replace("http://", f"http://bob:{KEY}@") + f"/?key={KEY}-query&api-version=2024"
    judge = LLMJudge(url)
    assert judge.endpoint == server.base_url + f"/chat/completions?key={KEY}-query&api-version=2024"
    for text in (repr(judge), str(judge)):
        assert KEY not in text and "***@127.0.0.1" in text and "key=***" in text
    server.behaviour = {"status": 500, "body": f"bad request for {url}"}
    with pytest.raises(JudgeError) as err:
        judge.score("q", "p", "t")
    assert KEY not in str(err.value)
    server.behaviour = {"content": "1"}
    assert judge.score("q", "p", "t") == 1.0 and server.requests[-1]["path"].startswith("/v1/chat/completions?key=")
    assert server.requests[-1]["headers"]["Authorization"].startswith("Basic ")
    with pytest.raises(ValueError) as err:
        LLMJudge(f"ftp://bob:{KEY}@example/v1?token={KEY}")
    assert KEY not in str(err.value)
