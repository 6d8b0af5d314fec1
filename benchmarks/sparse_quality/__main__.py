from benchmarks.sparse_quality.run import main

raise SystemExit(main())
