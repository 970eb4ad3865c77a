"""The runner program: dials the server's tunnel and runs agents in a workspace.

Also what the server shares with it: the tunnel protocol, the bundle format, the runner
id scheme and the workspace tools. Nothing in this package imports Django or a server app
(an import-linter contract checks it), so a runner can run on a machine that has no
server database. Start it with ``python -m omnigent_runner``.
"""

RUNNER_VERSION = "0.1.0"
PROTOCOL_VERSION = 1
