"""Serving: the HTTP plumbing every server shares (`http_server`), the OpenAI-compatible API
(`openai_api`) and `clarifyjax generate` batch jobs (`batch_job`)."""
from __future__ import annotations

