"""The vLLM server client without a server: request bodies, answers, timeouts and failures."""

import json
import socket
import struct
import threading
import time

import pytest

from grpo.lm.engines.server_settings import ServerSettings
from grpo.lm.engines.settings import RolloutSettings
from grpo.lm.engines.vllm_client import (
    ServerClient,
    ServerError,
    completion_body,
    parse_completion,
    parse_prompt_logprobs,
    probe_body,
)
from grpo.lm.engines.vllm_server import split_rows
from grpo.lm.sampling import GenerationSettings


def test_completion_body_sends_token_ids_and_every_knob():
    """Token ids go in as ids (no special tokens added), ids and log-probs are asked back, and
    every sampling processor is set explicitly, off ones included."""
    settings = GenerationSettings(max_new_tokens=7, temperature=0.7, top_p=0.9, top_k=5)
    body = completion_body("m", [3, 4, 5], settings, [2, 9], seed=11)
    assert body["prompt"] == [3, 4, 5] and body["add_special_tokens"] is False
    assert body["return_token_ids"] is True and body["logprobs"] == 0
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.7, 0.9, 5)
    assert (body["max_tokens"], body["stop_token_ids"], body["seed"]) == (7, [2, 9], 11)
    assert (body["min_p"], body["repetition_penalty"], body["presence_penalty"]) == (0, 1, 0)
    assert (body["frequency_penalty"], body["min_tokens"], body["n"]) == (0, 0, 1)
    assert "detokenize" not in body  # not a field of the completion API


def test_greedy_body_is_temperature_zero_without_truncation():
    """do_sample=False: temperature 0, top_p 1, top_k 0 (no limit), whatever else is set."""
    body = completion_body("m", [1], GenerationSettings(do_sample=False, top_k=3), [], None)
    assert (body["temperature"], body["top_p"], body["top_k"], body["seed"]) == (0, 1, 0, None)


def test_parse_completion_and_probe_answers():
    """Ids and log-probs come back as sent; a length mismatch or a missing field is an error."""
    choice = {"token_ids": [5, 6], "logprobs": {"token_logprobs": [-0.5, -1.25]}}
    choice["finish_reason"] = "stop"
    assert parse_completion({"choices": [choice]}, 4) == ([5, 6], [-0.5, -1.25])
    short = {**choice, "logprobs": {"token_logprobs": [-0.5]}}
    with pytest.raises(ValueError, match="2 token ids but 1 log-probs"):
        parse_completion({"choices": [short]}, 4)
    with pytest.raises(ValueError, match="without token ids"):
        parse_completion({"choices": [{**choice, "logprobs": None}]}, 4)
    body = probe_body("m", [1, 2, 3])
    assert body["prompt_logprobs"] == 0 and body["temperature"] == 1.0 and body["top_k"] == 0
    entries = [None, {"2": {"logprob": -1.5}}, {"3": {"logprob": -0.25}}]
    answer = {"choices": [{"prompt_logprobs": entries}]}
    assert parse_prompt_logprobs(answer, [1, 2, 3]) == [-1.5, -0.25]


def test_only_finished_answers_are_completions():
    """"stop" and "length" at max_tokens are completions; "abort", an error, a missing reason or
    "length" short of max_tokens (which the policy would count as finished) are ValueErrors
    naming the reason."""
    ids, logprobs = [5, 6, 7], {"token_logprobs": [-0.5, -1.0, -2.0]}

    def answer(reason):
        return {"choices": [{"token_ids": ids, "logprobs": logprobs, "finish_reason": reason}]}

    assert parse_completion(answer("stop"), 8) == (ids, [-0.5, -1.0, -2.0])
    assert parse_completion(answer("length"), 3) == (ids, [-0.5, -1.0, -2.0])
    for reason in ("abort", "error", None):
        with pytest.raises(ValueError, match=f"finish_reason {reason!r} after 3 tokens"):
            parse_completion(answer(reason), 8)
    with pytest.raises(ValueError, match="'length' after 3 tokens, not max_tokens 8"):
        parse_completion(answer("length"), 8)
    with pytest.raises(ValueError, match="without token ids"):
        parse_completion({"choices": [{"token_ids": ids, "logprobs": logprobs}]}, 8)


def test_split_rows_covers_every_row_once_in_near_equal_parts():
    """Contiguous parts, sizes differing by at most one, together exactly range(n)."""
    for n, parts in [(10, 3), (2, 3), (0, 2), (8, 1)]:
        ranges = split_rows(n, parts)
        assert len(ranges) == parts and [i for r in ranges for i in r] == list(range(n))
        assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


def _silent_server(held: list) -> tuple[socket.socket, str]:
    """A socket that accepts connections (kept open in `held`) and never answers: a stall."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    threading.Thread(target=lambda: held.append(listener.accept()), daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_a_stalled_server_raises_naming_it_within_the_timeout():
    """No answer: a ServerError naming the URL and the call in flight after ~timeout_s, no hang."""
    held: list = []
    listener, url = _silent_server(held)
    client = ServerClient(url, "key", timeout_s=0.5, connect_timeout_s=0.5, pool=2)
    start = time.monotonic()
    with pytest.raises(ServerError) as caught:
        client.post("/v1/completions", {}, "sampling prompt rows 0-3")
    assert time.monotonic() - start < 5
    assert url in str(caught.value) and "sampling prompt rows 0-3" in str(caught.value)
    assert "did not answer within" in str(caught.value)
    client.close()
    listener.close()


def test_a_dead_server_raises_naming_it():
    """Connection refused: a ServerError naming the URL and the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}"
    client = ServerClient(url, None, timeout_s=2, connect_timeout_s=2, pool=1)
    with pytest.raises(ServerError, match=f"vLLM server {url} failed while reloading"):
        client.rpc("grpo_reload", ["/x", "v"], "reloading weights")
    client.close()


def _resetting_server(resets: int) -> tuple[socket.socket, str, list[int]]:
    """A server that reads each request and resets its first `resets` connections unanswered
    (what a server closing an idle kept-alive connection does to a request sent on it), then
    answers {"ok": n} on the n-th connection. The list holds the connections' count."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    seen = [0]

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # the listener is closed: the test is over
                return
            seen[0] += 1
            connection.recv(65536)
            if seen[0] <= resets:
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                body = json.dumps({"ok": seen[0]}).encode()
                head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                connection.sendall(f"{head}{len(body)}\r\n\r\n".encode() + body)
            connection.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}", seen


def test_a_reset_connection_is_sent_again_once():
    """A request whose connection the server resets unanswered is sent once more, on a new
    connection: the second answer comes back. Reset twice: a ServerError naming the server, after
    exactly two connections (one resend, not a loop)."""
    listener, url, seen = _resetting_server(resets=1)
    client = ServerClient(url, None, timeout_s=5, connect_timeout_s=5, pool=1)
    assert client.post("/v1/completions", {}, "sampling prompt rows 0-3") == {"ok": 2}
    assert seen == [2]
    client.close()
    listener.close()
    listener, url, seen = _resetting_server(resets=2)
    client = ServerClient(url, None, timeout_s=5, connect_timeout_s=5, pool=1)
    with pytest.raises(ServerError, match=f"vLLM server {url} failed while sampling prompt rows"):
        client.post("/v1/completions", {}, "sampling prompt rows 0-3")
    assert seen == [2]
    client.close()
    listener.close()


def test_server_settings_are_checked_with_the_field_named():
    """Bad URLs, duplicates, non-positive limits and a server engine without URLs are refused."""
    assert ServerSettings(urls="http://h:1/").urls == ["http://h:1"]
    bad = [
        ({"urls": ["h:1"]}, "server.urls"),
        ({"urls": ["http://h:1", "http://h:1/"]}, "a URL twice"),
        ({"timeout_s": 0}, "server.timeout_s"),
        ({"keep_versions": 0}, "server.keep_versions"),
        ({"max_concurrency": 1.5}, "server.max_concurrency"),
        ({"api_key_env": ""}, "server.api_key_env"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=message):
            ServerSettings(**kwargs)
    with pytest.raises(ValueError, match="rollout.server.urls"):
        RolloutSettings(engine="vllm_server")
    rollout = RolloutSettings.from_dict(
        {"engine": "vllm_server", "server": {"urls": ["http://a:1"]}}
    )
    assert rollout.server.urls == ["http://a:1"]
    with pytest.raises(ValueError, match="rollout.server: got unknown key"):
        RolloutSettings.from_dict({"server": {"url": "http://a:1"}})
