from benchmarks.serve.run import main

raise SystemExit(main())
