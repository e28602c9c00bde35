"""HTTP calls to one `vllm serve` process, and the JSON of its completions.

Every call has a timeout (`httpx`: connect and read), and every failure,
whatever its kind (refused connection, a timeout, an HTTP error, a malformed
answer), becomes one `ServerError` naming the server, the call and what the
trainer had in flight, so that a dead or stalled server ends a rollout with a
message instead of a hang.

Idle connections: the server closes a kept-alive connection after
`VLLM_HTTP_TIMEOUT_KEEP_ALIVE` seconds (5 by default). A client that keeps it
as long can send a request just as the server closes it, and the server
resets it unread. So the client drops idle connections sooner
(`KEEPALIVE_S`), and a call whose connection was reset or closed under it
(`RESENT`) is sent once more on a new one before it counts as a failure.
Every call here may run twice: a seeded completion samples the same tokens
again, a reload loads the same folder, a probe scores the same ids.

The request body is plain mapping (tested without a server): token ids in
(`prompt` as a list of ints, no special tokens added), token ids
(`return_token_ids`) and the sampled tokens' log-probs out, so nothing is
re-tokenised; every sampling knob is sent, the ones left off included, since
a server applies the checkpoint's generation config to whatever a request
leaves unset unless it runs with `--generation-config vllm`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from grpo.lm.engines.vllm_requests import sampling_params_kwargs
from grpo.lm.sampling import GenerationSettings

__all__ = [
    "FINISHED",
    "ServerClient",
    "ServerError",
    "completion_body",
    "parse_completion",
    "parse_prompt_logprobs",
    "probe_body",
]

# SamplingParams arguments that are not fields of the OpenAI completion request
_NOT_IN_API = ("detokenize",)
KEEPALIVE_S = 2.0  # below the server's keep-alive (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s)
RESENT = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


class ServerError(RuntimeError):
    """A vLLM server failed a call (its URL, the call and what was in flight are in the text)."""


class ServerClient:
    """Calls to one server, each bounded by `timeout_s` (connect: `connect_timeout_s`)."""

    def __init__(
        self, url: str, api_key: str | None, timeout_s: float, connect_timeout_s: float, pool: int
    ) -> None:
        self.url = url
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(
            base_url=url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(
                max_connections=pool, max_keepalive_connections=pool, keepalive_expiry=KEEPALIVE_S
            ),
        )
        self.timeout_s = timeout_s

    def get(self, path: str, what: str, params: dict[str, str] | None = None) -> Any:
        """GET `path` -> its JSON; ServerError naming `what` on any failure."""
        return self._call("GET", path, what, params=params)

    def post(self, path: str, body: dict[str, Any] | None, what: str) -> Any:
        """POST `body` as JSON to `path` -> its JSON (None for an empty answer)."""
        return self._call("POST", path, what, json=body)

    def rpc(self, method: str, args: Sequence[str], what: str) -> list[Any]:
        """A worker method through `/collective_rpc` (dev mode) -> one result per worker."""
        body = {"method": method, "args": list(args), "timeout": self.timeout_s}
        answer = self.post("/collective_rpc", body, what)
        if not isinstance(answer, dict) or not isinstance(answer.get("results"), list):
            raise ServerError(f"vLLM server {self.url}: {what}: unexpected answer {answer!r}")
        return answer["results"]

    def _request(self, verb: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request, sent again once if its connection was reset or closed under it."""
        try:
            return self.http.request(verb, path, **kwargs)
        except RESENT:
            return self.http.request(verb, path, **kwargs)

    def _call(self, verb: str, path: str, what: str, **kwargs: Any) -> Any:
        try:
            response = self._request(verb, path, **kwargs)
        except httpx.TimeoutException as error:
            raise ServerError(
                f"vLLM server {self.url} did not answer within its timeout "
                f"(rollout.server.timeout_s={self.timeout_s:g}) while {what}: "
                f"{type(error).__name__}"
            ) from error
        except httpx.HTTPError as error:
            raise ServerError(
                f"vLLM server {self.url} failed while {what}: {type(error).__name__}: {error}"
            ) from error
        if response.status_code != 200:
            detail = response.text[:500]
            raise ServerError(
                f"vLLM server {self.url} answered HTTP {response.status_code} to {verb} {path} "
                f"while {what}: {detail}"
            )
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError as error:
            raise ServerError(
                f"vLLM server {self.url} answered {path} with something that is not JSON "
                f"while {what}"
            ) from error

    def close(self) -> None:
        self.http.close()


def completion_body(
    model: str,
    prompt: Sequence[int],
    settings: GenerationSettings,
    eos_ids: Sequence[int],
    seed: int | None,
) -> dict[str, Any]:
    """`/v1/completions` request sampling one completion of `prompt` (token ids)."""
    params = sampling_params_kwargs(settings, eos_ids, seed)
    for key in _NOT_IN_API:
        params.pop(key)
    return {
        "model": model,
        "prompt": [int(t) for t in prompt],
        **params,
        "stream": False,
        "echo": False,
        "add_special_tokens": False,  # the ids are the prompt, as the trainer encoded it
        "return_token_ids": True,
        "prompt_logprobs": None,
        "logit_bias": None,
        "allowed_token_ids": None,
        "bad_words": [],
        "use_beam_search": False,
        "length_penalty": 1.0,
        "include_stop_str_in_output": False,
        "truncate_prompt_tokens": None,
    }


FINISHED = ("stop", "length")
"""Finish reasons of a completed request: "stop" (an EOS id or a stop string), "length"
(max_tokens reached). Anything else ("abort", an error) did not finish."""


def parse_completion(answer: Any, max_tokens: int) -> tuple[list[int], list[float]]:
    """A `/v1/completions` answer with one choice, asked for at most `max_tokens` tokens ->
    (token ids, their log-probs). ValueError unless the request finished: "stop", or "length"
    with all `max_tokens` tokens (what the policy counts as truncated)."""
    try:
        (choice,) = answer["choices"]
        ids = [int(t) for t in choice["token_ids"]]
        logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        reason = choice["finish_reason"]
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"a completion without token ids, log-probs or finish_reason ({error!r})"
        ) from error
    if reason not in FINISHED:
        raise ValueError(
            f"finish_reason {reason!r} after {len(ids)} tokens (allowed: 'stop', 'length'): "
            "the request did not finish, and its tokens are not a completion"
        )
    if reason == "length" and len(ids) != max_tokens:
        raise ValueError(
            f"finish_reason 'length' after {len(ids)} tokens, not max_tokens {max_tokens}: "
            "the server cut it short of what the policy would count as truncated"
        )
    if len(logprobs) != len(ids):
        raise ValueError(f"{len(ids)} token ids but {len(logprobs)} log-probs")
    return ids, logprobs


def probe_body(model: str, ids: Sequence[int]) -> dict[str, Any]:
    """`/v1/completions` request scoring `ids` (prompt log-probs at temperature 1)."""
    settings = GenerationSettings(max_new_tokens=1, do_sample=True, temperature=1.0, top_p=1.0)
    body = completion_body(model, ids, settings, [], 0)
    body["prompt_logprobs"] = 0  # the prompt token's own log-prob at every position
    return body


def parse_prompt_logprobs(answer: Any, ids: Sequence[int]) -> list[float]:
    """log p(ids[t + 1] | ids[:t + 1]) from a `probe_body` answer -> (len(ids) - 1,)."""
    try:
        (choice,) = answer["choices"]
        entries = choice["prompt_logprobs"][1:]  # the first token has no log-prob
        return [float(entry[str(t)]["logprob"]) for entry, t in zip(entries, ids[1:], strict=True)]
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"prompt log-probs missing from the probe's answer ({error!r})") from error
