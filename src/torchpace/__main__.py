"""`python -m torchpace` is the `torchpace` command."""

import sys

from torchpace.cli import main

sys.exit(main())
