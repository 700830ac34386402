"""`python -m ttt_pipeline ...`: the `ttt-pipeline` command."""
from ttt_pipeline.cli.main import main

raise SystemExit(main())
