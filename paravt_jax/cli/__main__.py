"""`python -m paravt_jax.cli COMMAND ...` (what the launch scripts run)."""
import sys

from paravt_jax.cli.dispatch import main

sys.exit(main())
