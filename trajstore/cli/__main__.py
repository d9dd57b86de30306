"""``python -m trajstore.cli``: the ``trajstore`` command."""

import sys

from trajstore.cli.main import main

sys.exit(main())
