"""Workloads that ``bench.serve`` replays: sessions of requests over token-id prompts.

A :class:`Request` names its ``parent`` -- an earlier request of the same session whose prompt
*and answer* it extends -- and the ``new`` tokens it appends; the client builds the prompt when
the parent's answer is in (a multi-turn chat's turn k+1 is turn k's prompt + turn k's answer + a
new user message). ``parent=None``: the prompt is ``new`` alone. Answers run to ``max_tokens``
(no stop tokens are sent), so a workload's unique tokens -- its working set -- are known when it
is generated, and every workload is sized to ``ws_mult`` x the HBM pool (num_blocks x block_size
tokens). Deterministic by seed.

Four kinds:

* ``chat`` -- multi-turn: user turns and answers drawn from a clipped log-normal shaped like
  ShareGPT's (many short turns, a long tail), sessions of several turns, all sessions live at
  once (turn k+1 waits for turn k), so the reuse distance of a session's prefix is the whole
  working set;
* ``docqa`` -- D documents x Q questions, each request document + question, asked round-robin
  over the documents (question 1 of every document, then question 2, ...);
* ``agentic`` -- one shared tool prompt, trajectories that grow by an observation per step
  (each step extends the previous step's prompt + answer), some steps retries branching from an
  earlier step;
* ``noreuse`` -- unique random prompts (the overhead of caching with nothing to reuse).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

WORKLOADS = ("chat", "docqa", "agentic", "noreuse")


@dataclass(frozen=True, slots=True)
class Request:
    new: tuple[int, ...]
    max_tokens: int
    parent: int | None = None  # index in the session of the request this one extends


@dataclass(frozen=True, slots=True)
class Session:
    requests: tuple[Request, ...]


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    sessions: tuple[Session, ...]
    unique_tokens: int  # prompt + answer tokens no two requests share (the working set)
    notes: str = ""

    @property
    def num_requests(self) -> int:
        return sum(len(s.requests) for s in self.sessions)


@dataclass(frozen=True, slots=True)
class Shape:
    """Token lengths of one preset (scaled to the model's context)."""

    max_len: int  # the model's context: prompt + answer of any request stays below it
    user: tuple[int, int]  # a chat user turn, min/max
    answer: tuple[int, int]  # a chat answer
    turns: tuple[int, int]
    doc: int
    questions: int
    question: tuple[int, int]
    qa_answer: tuple[int, int]
    tool_prompt: int
    task: tuple[int, int]
    observation: tuple[int, int]
    action: tuple[int, int]
    steps: tuple[int, int]
    retry_p: float = 0.25
    extra: dict[str, int] = field(default_factory=dict)


#: by model: ``tiny`` has a 256-token context, ``small`` 4096
SHAPES = {
    "tiny": Shape(max_len=256, user=(12, 48), answer=(8, 24), turns=(2, 5), doc=128,
                  questions=3, question=(12, 32), qa_answer=(8, 16), tool_prompt=64,
                  task=(12, 24), observation=(12, 32), action=(6, 12), steps=(3, 6)),
    "small": Shape(max_len=4096, user=(20, 200), answer=(20, 150), turns=(2, 8), doc=1024,
                   questions=4, question=(16, 64), qa_answer=(16, 48), tool_prompt=512,
                   task=(32, 96), observation=(32, 160), action=(16, 48), steps=(3, 8)),
}


def _lognormal(rng: random.Random, lo: int, hi: int) -> int:
    """ShareGPT-like: median near the geometric mean of the range, a long right tail, clipped."""
    mu = (math.log(lo) + math.log(hi)) / 2 - 0.25
    return max(lo, min(hi, round(rng.lognormvariate(mu, 0.6))))


class _Tokens:
    """Random token ids in [1, vocab) -- every draw is fresh, so nothing is shared by chance."""

    def __init__(self, rng: random.Random, vocab: int) -> None:
        self.rng, self.vocab = rng, vocab

    def __call__(self, n: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(1, self.vocab) for _ in range(n))


def chat(shape: Shape, ws_tokens: int, vocab: int, seed: int) -> Workload:
    rng = random.Random(f"chat-{seed}")
    tok = _Tokens(rng, vocab)
    sessions, total = [], 0
    while total < ws_tokens:
        reqs: list[Request] = []
        ctx = 0
        for k in range(rng.randint(*shape.turns)):
            user, ans = _lognormal(rng, *shape.user), _lognormal(rng, *shape.answer)
            if ctx + user + ans > shape.max_len:
                break
            reqs.append(Request(tok(user), ans, parent=k - 1 if k else None))
            ctx += user + ans
        if reqs:
            sessions.append(Session(tuple(reqs)))
            total += ctx
    return Workload("chat", tuple(sessions), total,
                    f"{len(sessions)} sessions, all live, turn k+1 after turn k's answer")


def docqa(shape: Shape, ws_tokens: int, vocab: int, seed: int) -> Workload:
    rng = random.Random(f"docqa-{seed}")
    tok = _Tokens(rng, vocab)
    n_docs = max(1, math.ceil(ws_tokens / shape.doc))
    docs = [tok(shape.doc) for _ in range(n_docs)]
    sessions, total = [], n_docs * shape.doc
    for _ in range(shape.questions):
        for d in docs:
            q, a = rng.randint(*shape.question), rng.randint(*shape.qa_answer)
            sessions.append(Session((Request(d + tok(q), a),)))
            total += q + a
    return Workload("docqa", tuple(sessions), total,
                    f"{n_docs} documents of {shape.doc} tokens x {shape.questions} questions, "
                    "round-robin over the documents")


def agentic(shape: Shape, ws_tokens: int, vocab: int, seed: int) -> Workload:
    rng = random.Random(f"agentic-{seed}")
    tok = _Tokens(rng, vocab)
    tools = tok(shape.tool_prompt)
    sessions, total, retries = [], shape.tool_prompt, 0
    while total < ws_tokens:
        task, act = rng.randint(*shape.task), rng.randint(*shape.action)
        reqs = [Request(tools + tok(task), act)]
        ctx = [shape.tool_prompt + task + act]  # context length after each step's answer
        total += task + act
        for _ in range(rng.randint(*shape.steps) - 1):
            parent = len(reqs) - 1
            if len(reqs) > 1 and rng.random() < shape.retry_p:
                parent = rng.randrange(len(reqs) - 1)  # a retry from an earlier step
                retries += 1
            obs, act = rng.randint(*shape.observation), rng.randint(*shape.action)
            if ctx[parent] + obs + act > shape.max_len:
                break
            reqs.append(Request(tok(obs), act, parent=parent))
            ctx.append(ctx[parent] + obs + act)
            total += obs + act
        sessions.append(Session(tuple(reqs)))
    return Workload("agentic", tuple(sessions), total,
                    f"{len(sessions)} trajectories over a {shape.tool_prompt}-token tool "
                    f"prompt, {retries} retries from an earlier step")


def noreuse(shape: Shape, ws_tokens: int, vocab: int, seed: int) -> Workload:
    rng = random.Random(f"noreuse-{seed}")
    tok = _Tokens(rng, vocab)
    sessions, total = [], 0
    hi = min(shape.doc + shape.question[1], shape.max_len - shape.qa_answer[1])
    while total < ws_tokens:
        n, a = rng.randint(hi // 2, hi), rng.randint(*shape.qa_answer)
        sessions.append(Session((Request(tok(n), a),)))
        total += n + a
    return Workload("noreuse", tuple(sessions), total, f"{len(sessions)} unique prompts")


GENERATORS = {"chat": chat, "docqa": docqa, "agentic": agentic, "noreuse": noreuse}


def build(name: str, shape: Shape, ws_tokens: int, vocab: int, seed: int = 0) -> Workload:
    """Workload ``name`` with about ``ws_tokens`` unique tokens."""
    return GENERATORS[name](shape, ws_tokens, vocab, seed)


def prompt_of(session: Session, k: int, answers: dict[int, list[int]]) -> list[int]:
    """Request ``k``'s prompt: its parent's prompt + the parent's answer (``answers``, by request
    index, as the server returned it) + the request's new tokens."""
    req = session.requests[k]
    if req.parent is None:
        return list(req.new)
    return prompt_of(session, req.parent, answers) + answers[req.parent] + list(req.new)
