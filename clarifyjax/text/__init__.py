"""Text in and out of the models: tokenizers (`tokenizer`), each model's input format
(`formats`), and the text-generator interface (`generator`)."""
from __future__ import annotations

