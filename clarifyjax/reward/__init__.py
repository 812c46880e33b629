"""ClarifyDelphi's reward: the pure JSD and normalizer (`jsd`), the judge (`judge`), the NLI
filter (`nli`), and the batched pipeline that composes them (`pipeline`)."""
from __future__ import annotations

