"""`python -m agenttest_submit.cli`: the same as `agenttest-submit`."""

import sys

from agenttest_submit.cli.main import main

sys.exit(main())
