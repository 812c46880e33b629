"""ClarifyDelphi in use: the clarifier (`clarifier`), the options the commands share, and the
`ask`, `interact` and `web` commands."""
from __future__ import annotations

