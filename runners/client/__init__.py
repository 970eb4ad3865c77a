"""The runner program: dials the server's tunnel and runs agents in a workspace.

Nothing in this package imports Django, so a runner can run on a machine that has no
server database. Start it with ``python -m runners.client``.
"""

RUNNER_VERSION = "0.1.0"
PROTOCOL_VERSION = 1
