"""The prefix-cache traces ``bench.policies`` replays: multi-turn chat, shared-document RAG and
agent trees. A request is a chain of block keys (ints) in which a key names its whole prefix, as
the store's chained hashes do; every trace is deterministic for a given seed.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import random
from collections.abc import Iterator, Sequence



@dataclasses.dataclass(frozen=True, slots=True)
class Trace:
    """A named sequence of requests; each request is a prefix chain of block keys (ints)."""

    name: str
    requests: list[list[int]]
    params: dict[str, object]

    def stats(self) -> TraceStats:
        """Blocks requested, unique blocks, and the peak live set: the most blocks that have been
        requested and will be requested again, at any point of the trace."""
        flat = [k for r in self.requests for k in r]
        delta = [0] * (len(flat) + 1)  # +1 where a live interval opens, -1 where it closes
        last: dict[int, int] = {}
        for pos, key in enumerate(flat):
            prev = last.get(key)
            if prev is not None:
                delta[prev] += 1
                delta[pos] -= 1
            last[key] = pos
        live = peak = 0
        for d in delta:
            live += d
            peak = max(peak, live)
        return TraceStats(len(flat), len(last), peak)


@dataclasses.dataclass(frozen=True, slots=True)
class TraceStats:
    blocks: int
    unique_blocks: int
    peak_live_blocks: int


class _Chains:
    """Interns (parent key, block content) -> key, so a key names its whole prefix: the same
    content after the same prefix is the same key, and after another prefix a different one."""

    def __init__(self) -> None:
        self._keys: dict[tuple[int, object], int] = {}

    def extend(self, chain: list[int], contents: Iterator[object] | Sequence[object]) -> list[int]:
        """A new chain: ``chain`` followed by one block per item of ``contents``."""
        out = list(chain)
        parent = out[-1] if out else -1
        keys = self._keys
        for content in contents:
            parent = keys.setdefault((parent, content), len(keys))
            out.append(parent)
        return out


def _system_prompts(chains: _Chains, blocks: Sequence[int]) -> list[list[int]]:
    """One chain per system prompt, the i-th ``blocks[i]`` blocks long (shared by every trace's
    requests that start from it)."""
    return [chains.extend([], (("sys", i, j) for j in range(n))) for i, n in enumerate(blocks)]


def _geometric(rng: random.Random, mean: float) -> int:
    """A draw from the geometric law on 1, 2, 3, ... with the given mean (>= 1)."""
    if mean <= 1.0:
        return 1
    return 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - 1.0 / mean))


class _Zipf:
    """Draws ranks 0..n-1 with P(rank r) proportional to 1 / (r + 1) ** s."""

    def __init__(self, n: int, s: float, rng: random.Random) -> None:
        self._cum = list(itertools.accumulate(1.0 / (r + 1) ** s for r in range(n)))
        self._rng = rng

    def draw(self) -> int:
        x = self._rng.random() * self._cum[-1]
        return min(bisect.bisect_right(self._cum, x), len(self._cum) - 1)


def multi_turn_chat(
    num_requests: int,
    *,
    seed: int = 1,
    num_conversations: int = 256,
    zipf_s: float = 1.0,
    system_prompt_blocks: Sequence[int] = (16, 32, 48, 64),
    mean_turns: float = 8.0,
    user_blocks: tuple[int, int] = (1, 8),
    reply_blocks: tuple[int, int] = (2, 16),
) -> Trace:
    """Multi-turn chat, as served by a chat front end with many users at once.

    ``num_conversations`` conversations are open at any time, in slots with Zipf(``zipf_s``)
    popularity: each request picks a slot by that law (fast typists and long sessions in the hot
    slots, idle tabs in the cold ones) and the conversation there takes its next turn. Turn k's
    prompt is one of ``len(system_prompt_blocks)`` system prompts (picked per conversation, Zipf
    s=1; lengths in blocks as given) + every earlier user message and model reply + the new user
    message, so turn k's chain extends turn k-1's by the previous reply and the new message. User
    messages and replies are uniform in ``user_blocks`` / ``reply_blocks`` (blocks of 16 tokens).
    A conversation lasts a geometric number of turns (mean ``mean_turns``), after which a new
    one opens in its slot. Replies enter the cache as part of the next prompt (the store saves
    prompt KV). Deterministic for a given ``seed``.
    """
    rng = random.Random(seed)
    chains = _Chains()
    system = _system_prompts(chains, system_prompt_blocks)
    pick_system = _Zipf(len(system), 1.0, rng)
    pick_slot = _Zipf(num_conversations, zipf_s, rng)
    conv_ids = itertools.count()

    def new_conversation() -> dict[str, object]:
        return {
            "id": next(conv_ids),
            "chain": system[pick_system.draw()],
            "turn": 0,
            "turns": _geometric(rng, mean_turns),
            "reply": 0,
        }

    slots = [new_conversation() for _ in range(num_conversations)]
    requests: list[list[int]] = []
    for _ in range(num_requests):
        slot = pick_slot.draw()
        conv = slots[slot]
        cid, turn = conv["id"], conv["turn"]
        contents = [("reply", cid, turn, j) for j in range(conv["reply"])]  # type: ignore[arg-type]
        contents += [("user", cid, turn, j) for j in range(rng.randint(*user_blocks))]
        chain = chains.extend(conv["chain"], contents)  # type: ignore[arg-type]
        requests.append(chain)
        conv["chain"] = chain
        conv["turn"] = turn + 1  # type: ignore[operator]
        conv["reply"] = rng.randint(*reply_blocks)
        if conv["turn"] >= conv["turns"]:  # type: ignore[operator]
            slots[slot] = new_conversation()
    params = dict(num_requests=num_requests, seed=seed, num_conversations=num_conversations,
                  zipf_s=zipf_s, system_prompt_blocks=list(system_prompt_blocks),
                  mean_turns=mean_turns, user_blocks=user_blocks, reply_blocks=reply_blocks)
    return Trace("multi_turn_chat", requests, params)


def shared_document_rag(
    num_requests: int,
    *,
    seed: int = 2,
    num_documents: int = 2000,
    zipf_s: float = 1.0,
    document_blocks: tuple[int, int] = (8, 64),
    documents_per_request: tuple[int, int] = (1, 3),
    system_prompt_blocks: Sequence[int] = (24, 40),
    question_blocks: tuple[int, int] = (1, 4),
) -> Trace:
    """Retrieval-augmented generation over a shared document pool.

    A pool of ``num_documents`` documents (lengths uniform in ``document_blocks``) with
    Zipf(``zipf_s``) popularity. Each request = one of ``len(system_prompt_blocks)`` system prompts
    (Zipf s=1) + 1 to 3 (``documents_per_request``, uniform) distinct documents drawn by
    popularity, in the order drawn (the retriever's ranking) + a unique question (uniform in
    ``question_blocks``). Keys name whole prefixes, so a document's blocks are shared only by
    requests with the same system prompt and the same documents before it: the first document
    hits often, later ones only when the whole combination recurs, the question never. That is
    what a prefix cache can do for RAG without position-independent caching. Deterministic for a
    given ``seed``.
    """
    rng = random.Random(seed)
    chains = _Chains()
    system = _system_prompts(chains, system_prompt_blocks)
    pick_system = _Zipf(len(system), 1.0, rng)
    pick_doc = _Zipf(num_documents, zipf_s, rng)
    # Indexed by popularity rank; drawn independently of it.
    doc_len = [rng.randint(*document_blocks) for _ in range(num_documents)]
    requests: list[list[int]] = []
    for q in range(num_requests):
        k = rng.randint(*documents_per_request)
        docs: list[int] = []
        while len(docs) < k:
            d = pick_doc.draw()
            if d not in docs:
                docs.append(d)
        contents: list[object] = [("doc", d, j) for d in docs for j in range(doc_len[d])]
        contents += [("question", q, j) for j in range(rng.randint(*question_blocks))]
        requests.append(chains.extend(system[pick_system.draw()], contents))
    params = dict(num_requests=num_requests, seed=seed, num_documents=num_documents,
                  zipf_s=zipf_s, document_blocks=document_blocks,
                  documents_per_request=documents_per_request,
                  system_prompt_blocks=list(system_prompt_blocks),
                  question_blocks=question_blocks)
    return Trace("shared_document_rag", requests, params)


def agent_tree(
    num_requests: int,
    *,
    seed: int = 3,
    num_tasks: int = 64,
    system_prompt_blocks: Sequence[int] = (64, 96, 128),
    task_blocks: tuple[int, int] = (4, 16),
    step_blocks: tuple[int, int] = (2, 12),
    mean_steps: float = 12.0,
    backtrack_prob: float = 0.2,
) -> Trace:
    """Tool-using agents whose steps form a tree.

    ``num_tasks`` tasks are in flight; each request picks one uniformly (an agent framework
    interleaving many tasks) and issues its next LLM call. A task starts from one of
    ``len(system_prompt_blocks)`` long system prompts (tool definitions; Zipf s=1) + a unique task
    description (``task_blocks``). Each step's prompt extends a parent step's prompt by the
    model's tool call and the tool's output (``step_blocks`` together): usually the latest step,
    but with probability ``backtrack_prob`` an earlier step, uniformly (the agent backtracks
    after a failed tool call, or explores an alternative), which branches the tree. A task ends
    after a geometric number of steps (mean ``mean_steps``) and a new one takes its place.
    Deterministic for a given ``seed``.
    """
    rng = random.Random(seed)
    chains = _Chains()
    system = _system_prompts(chains, system_prompt_blocks)
    pick_system = _Zipf(len(system), 1.0, rng)
    task_ids = itertools.count()

    def new_task() -> dict[str, object]:
        tid = next(task_ids)
        root = chains.extend(system[pick_system.draw()],
                             [("task", tid, j) for j in range(rng.randint(*task_blocks))])
        return {"id": tid, "steps": [root], "left": _geometric(rng, mean_steps)}

    tasks = [new_task() for _ in range(num_tasks)]
    requests: list[list[int]] = []
    for _ in range(num_requests):
        slot = rng.randrange(num_tasks)
        task = tasks[slot]
        steps: list[list[int]] = task["steps"]  # type: ignore[assignment]
        if len(steps) > 1 and rng.random() < backtrack_prob:
            parent = steps[rng.randrange(len(steps) - 1)]
        else:
            parent = steps[-1]
        n = len(steps)
        chain = chains.extend(parent, [("step", task["id"], n, j)
                                       for j in range(rng.randint(*step_blocks))])
        requests.append(chain)
        steps.append(chain)
        task["left"] = task["left"] - 1  # type: ignore[operator]
        if task["left"] <= 0:  # type: ignore[operator]
            tasks[slot] = new_task()
    params = dict(num_requests=num_requests, seed=seed, num_tasks=num_tasks,
                  system_prompt_blocks=list(system_prompt_blocks), task_blocks=task_blocks,
                  step_blocks=step_blocks, mean_steps=mean_steps, backtrack_prob=backtrack_prob)
    return Trace("agent_tree", requests, params)


def make_traces(quick: bool) -> list[Trace]:
    """The three traces; ``quick`` ones have a tenth of the requests."""
    scale = 0.1 if quick else 1.0
    return [
        multi_turn_chat(int(12_000 * scale)),
        shared_document_rag(int(12_000 * scale)),
        agent_tree(int(8_000 * scale)),
    ]
