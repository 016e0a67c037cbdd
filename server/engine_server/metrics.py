"""``GET /metrics`` (Prometheus text): TTFT, tokens reused per tier, requests by finish
reason. A registry per app, so two apps in one process (tests) do not collide. Fed from the
engine loop's ``on_finished`` (on its thread; prometheus-client's metrics are thread-safe)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from runtime.request import RequestOutput
from server.engine_server.engine_loop import EngineLoop

#: TTFT buckets (seconds): CPU presets land in the ms range, GPU hits below it
_TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.ttft = Histogram("kvstore_engine_ttft_seconds", "time to first token",
                              buckets=_TTFT_BUCKETS, registry=self.registry)
        self.reused = Counter("kvstore_engine_prompt_tokens_reused",
                              "prompt tokens whose K/V came from the cache, by tier", ["tier"],
                              registry=self.registry)
        self.computed = Counter("kvstore_engine_prompt_tokens_computed",
                                "prompt tokens run through the model in prefill",
                                registry=self.registry)
        self.generated = Counter("kvstore_engine_generation_tokens", "tokens generated",
                                 registry=self.registry)
        self.finished = Counter("kvstore_engine_requests_finished",
                                "requests finished, by reason", ["reason"],
                                registry=self.registry)

    def observe(self, out: RequestOutput) -> None:
        m = out.metrics
        if m.ttft_s is not None:
            self.ttft.observe(m.ttft_s)
        for tier, n in m.num_tokens_reused.items():
            self.reused.labels(tier).inc(n)
        self.computed.inc(m.num_tokens_computed)
        self.generated.inc(len(out.output_token_ids))
        self.finished.labels(out.finish_reason).inc()


def add_metrics(app: FastAPI, loop: EngineLoop) -> EngineMetrics:
    metrics = EngineMetrics()
    loop.on_finished.append(metrics.observe)

    @app.get("/metrics", include_in_schema=False)
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return metrics
