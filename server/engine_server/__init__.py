"""``kvstore engine serve``: an OpenAI-compatible HTTP server over the bundled runtime.

:mod:`.engine_loop` (one thread owns the engine), :mod:`.app` (the FastAPI routes),
:mod:`.schemas` (request types), :mod:`.openai_format` (response shapes, SSE),
:mod:`.build` (the served engine), :mod:`.cli` (the command)."""
