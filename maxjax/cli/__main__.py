"""``python -m maxjax.cli``: the same as the ``maxjax`` command."""

import sys

from maxjax.cli import main

sys.exit(main())
