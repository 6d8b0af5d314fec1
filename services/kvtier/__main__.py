"""``python -m services.kvtier [flags]``: run the kvtier service (see ``services.kvtier.cli_args``)."""

import sys

from services.kvtier.server import main

sys.exit(main())
