"""lm-evaluation-harness: a local causal LM folder as its model `clarifyjax` (`lm_eval_model`, which
needs the optional package lm-eval), offline task folders (`local_tasks`) and `clarifyjax lm-eval`,
its command line (`command`)."""
from __future__ import annotations
