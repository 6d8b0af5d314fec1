"""``python -m benchmarks.h200_projection [--trace trace.json]``: see ``run.py``."""
from benchmarks.h200_projection.run import main

raise SystemExit(main())
