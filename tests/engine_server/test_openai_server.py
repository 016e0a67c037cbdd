"""``kvstore engine serve``'s OpenAI-compatible app, against a real uvicorn on a free port:
greedy tokens equal ``Engine.generate`` on the same random model, streamed and not;
concurrent requests; prefix-cache reuse reported in ``usage``; 4xx for bad requests; a client
that disconnects mid-stream leaves no block held."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from runtime.engine import Engine
from runtime.sampling import SamplingParams
from server.engine_server.build import build_served
from server.engine_server.engine_loop import EngineLoop
from tests.engine_server.serving import serving

SEED = 0
BLOCK = 16


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a busy 2-core machine: tiny batches run best on one thread
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def reference(one_thread: None) -> Engine:
    """The same random weights (same preset and seed), no cache, no connector."""
    return Engine.from_config("tiny", seed=SEED, num_blocks=64, device="cpu",
                              enable_prefix_caching=False, capture_graphs_at_start=False)


@pytest.fixture(scope="module")
def server(one_thread: None) -> Iterator[tuple[str, EngineLoop]]:
    with serving(build_served("tiny", seed=SEED, num_blocks=64, block_size=BLOCK,
                              host_cache="4MiB", device="cpu")) as (url, loop):
        yield url, loop


@pytest.fixture
def client(server: tuple[str, EngineLoop]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server[0], timeout=60) as c:
        yield c


def greedy(reference: Engine, prompt: list[int], n: int) -> list[int]:
    (out,) = reference.generate([prompt], SamplingParams(max_tokens=n))
    return out.output_token_ids


def events(lines: Iterator[str]) -> list[Any]:
    """The SSE ``data:`` payloads, parsed (``[DONE]`` kept as the string)."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def test_completion_token_prompt_matches_generate(client: httpx.Client,
                                                  reference: Engine) -> None:
    prompt = list(range(100, 137))
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 12,
                                             "temperature": 0, "return_token_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    want = greedy(reference, prompt, 12)
    assert choice["token_ids"] == want
    assert choice["finish_reason"] == "length"
    assert body["object"] == "text_completion"
    assert body["usage"]["prompt_tokens"] == len(prompt)
    assert body["usage"]["completion_tokens"] == 12
    from runtime.tokenizer import ByteTokenizer
    assert choice["text"] == ByteTokenizer().decode(want)


def test_completion_text_prompt_is_byte_tokenized(client: httpx.Client, reference: Engine) -> None:
    r = client.post("/v1/completions", json={"prompt": "hello, paged world", "max_tokens": 5,
                                             "temperature": 0, "return_token_ids": True})
    assert r.status_code == 200, r.text
    from runtime.tokenizer import ByteTokenizer
    ids = ByteTokenizer().encode("hello, paged world")
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    assert r.json()["choices"][0]["token_ids"] == greedy(reference, ids, 5)


def test_streamed_tokens_match_generate(client: httpx.Client, reference: Engine) -> None:
    prompt = list(range(200, 223))
    got: list[int] = []
    with client.stream("POST", "/v1/completions", json={
            "prompt": prompt, "max_tokens": 10, "temperature": 0, "stream": True,
            "return_token_ids": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        evs = events(r.iter_lines())
    assert evs[-1] == "[DONE]"
    chunks = evs[:-1]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10
    for ch in chunks[:-1]:
        assert ch["object"] == "text_completion"
        got.extend(ch["choices"][0]["token_ids"])
    assert got == greedy(reference, prompt, 10)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all(ch["choices"][0]["finish_reason"] is None for ch in chunks[:-2])
    assert len(chunks) - 2 >= 2, "tokens came in more than one chunk (streamed, not at the end)"


def test_two_concurrent_requests_complete(server: tuple[str, EngineLoop],
                                          reference: Engine) -> None:
    prompts = [list(range(10, 40)), list(range(300, 321))]
    results: dict[int, Any] = {}

    def go(i: int) -> None:
        with httpx.Client(base_url=server[0], timeout=60) as c:
            results[i] = c.post("/v1/completions", json={
                "prompt": prompts[i], "max_tokens": 30, "temperature": 0,
                "return_token_ids": True})

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(2):
        assert results[i].status_code == 200, results[i].text
        assert results[i].json()["choices"][0]["token_ids"] == greedy(reference, prompts[i], 30)


def test_repeated_prompt_reports_reused_tokens(client: httpx.Client) -> None:
    prompt = list(range(50, 90))  # 40 tokens: 2 full blocks of 16
    req = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
    first = client.post("/v1/completions", json=req).json()["usage"]
    second = client.post("/v1/completions", json=req).json()["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["prompt_tokens_details"]["cached_tokens"] == 2 * BLOCK
    assert second["kvstore"]["tokens_computed"] == len(prompt) - 2 * BLOCK


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"prompt": []}, 400, "prompt is empty"),
    ({"prompt": ""}, 400, "prompt is empty"),
    ({"prompt": [1, 512]}, 400, "512 is outside [0, 512)"),
    ({"prompt": [1, -1]}, 400, "-1"),
    ({"prompt": [1, 2], "max_tokens": 300}, 400, "max_position_embeddings=256"),
    ({"prompt": [1, 2], "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": "3"}, 400, "max_tokens"),
    ({"prompt": [1, 2], "temperature": -1}, 400, "temperature"),
    ({"prompt": [1, 2], "top_p": 0}, 400, "top_p"),
    ({"prompt": [1, 2], "stop_token_ids": [600]}, 400, "stop_token_ids"),
    ({"prompt": [1, 2], "frobnicate": True}, 400, "frobnicate"),
    ({"prompt": [1, 2], "cache_salt": "tenant-a"}, 400, "cache_salt"),
    ({"prompt": [1, 2], "model": "gpt-4"}, 404, "gpt-4"),
    ({"max_tokens": 2}, 400, "prompt"),
])
def test_bad_requests_are_4xx_with_message(client: httpx.Client, body: dict[str, Any],
                                           status: int, needle: str) -> None:
    for stream in (False, True):
        r = client.post("/v1/completions", json={**body, "stream": stream})
        assert r.status_code == status, r.text
        assert needle in r.json()["error"]["message"]


def test_malformed_json_is_400(client: httpx.Client) -> None:
    r = client.post("/v1/completions", content=b"{not json",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["message"]


def test_models_and_health(client: httpx.Client) -> None:
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["tiny"]
    assert client.get("/health").json()["status"] == "ok"


def test_chat_completion(client: httpx.Client) -> None:
    r = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 3


def test_disconnect_mid_stream_aborts_and_leaves_no_block_held(server: tuple[str, EngineLoop]) -> None:
    url, loop = server
    assert _wait(lambda: loop.held_blocks() == 0 and not loop.engine.has_unfinished())
    aborted = loop.num_aborted
    reasons: list[str] = []
    loop.on_finished.append(lambda out: reasons.append(out.finish_reason))
    held_during = 0
    with httpx.Client(base_url=url, timeout=60) as c:
        with c.stream("POST", "/v1/completions", json={
                "prompt": list(range(20, 60)), "max_tokens": 200, "temperature": 0,
                "stream": True, "return_token_ids": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    held_during = loop.held_blocks()
                    break  # leave mid-stream: the response is closed below
    assert held_during > 0, "the request held blocks while it streamed"
    assert _wait(lambda: loop.num_aborted == aborted + 1), "the server saw no disconnect"
    assert _wait(lambda: loop.held_blocks() == 0 and not loop.engine.has_unfinished())
    assert loop.engine.num_pending_frees == 0
    assert reasons == ["abort"]  # ended early, not run on to its 200 tokens


def _wait(cond: Any, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_metrics_count_ttft_and_reused_tokens(client: httpx.Client) -> None:
    def sample(name: str) -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    ttft_before = sample("kvstore_engine_ttft_seconds_count")
    hbm_before = sample('kvstore_engine_prompt_tokens_reused_total{tier="hbm"}')
    prompt = list(range(400, 440))
    for _ in range(2):
        assert client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1,
                                                    "temperature": 0}).status_code == 200
    assert sample("kvstore_engine_ttft_seconds_count") == ttft_before + 2
    assert sample('kvstore_engine_prompt_tokens_reused_total{tier="hbm"}') == hbm_before + 2 * BLOCK
