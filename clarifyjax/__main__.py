"""`python -m clarifyjax ...`: the same as the `clarifyjax` command."""
import sys

from clarifyjax.cli import main

sys.exit(main())
