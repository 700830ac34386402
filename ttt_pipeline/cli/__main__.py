from ttt_pipeline.cli.main import main

raise SystemExit(main())
