"""The paper's evaluation: `clarifyjax evaluate` (`evaluate`), the baselines, Table 3/4 metrics,
the report, the QA informativeness metric and BERTScore."""
from __future__ import annotations

