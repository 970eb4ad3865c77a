"""Test doubles and process launchers shared by tests, benchmarks and ``make demo``.

``mockllm`` is the scripted OpenAI-compatible mock LLM (standard library only, no
Django; ``python -m testing.mockllm``), ``processes`` starts and stops real daphne
servers and runner programs and talks to them over HTTP and SSE, and ``balancer`` is
a small TCP balancer for fail-over tests.

This package is never imported by the server or the runner at run time.
"""
