"""`python -m diagd.daemon.cli`: the `diagd` command, as the daemon's launches and MCP host configs run it."""

import sys

from diagd.daemon.cli.cli import main

sys.exit(main())
