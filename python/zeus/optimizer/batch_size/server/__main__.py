"""`python -m zeus.optimizer.batch_size.server [serve|migrate] ...` (same as `zeus-bso-server`)."""

from zeus.optimizer.batch_size.server.cli import main

raise SystemExit(main())
