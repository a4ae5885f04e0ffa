"""The exit statuses of the `diagd` command, each named once: every module of daemon/cli (and the
stdio shim behind `diagd mcp`) returns these, never a bare number.

The same kind of mistake gets the same status whatever the command:

- USAGE: the command line is wrong: an unknown sub-command or option (argparse exits 2 as well), a
  name that is not in a fixed list (a tool, a tool group, a back end, an MCP host), a bad or missing
  argument, an option refused in that combination.
- FAILED: the command was understood but what it asked could not be done: a refusal of the operation
  (a DiagdError: a file diagd will not edit, a config the daemon refuses, a token or actor that does
  not exist now), a required check that failed (`diagd doctor`), a tool that answered with an error
  (`diagd call`).
- NO_DAEMON: no daemon served the command: none runs, or the one running refused the connection
  (every connection busy), hung up or did not answer in time.

`--ssh` adds its own, for a command that could not start on the remote host (daemon/cli/remote.py);
once it runs, the remote command's status passes through.

docs/cli.md's "Exit status" table lists exactly these (tests/daemon/test_exits.py compares them).
Nothing is imported here: `diagd mcp`, `status` and `call` start fast.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_DAEMON = 3
# `--ssh`: the remote command did not start (docs/ssh.md says what to do about each).
EXIT_SSH_MISSING = 4  # SSH_NOT_FOUND: no ssh client here
EXIT_UNREACHABLE = 5  # SSH_UNREACHABLE: refused, no route, DNS, timeout
EXIT_AUTH = 6  # SSH_AUTH_FAILED: key refused, host key unknown or changed
EXIT_VERSION = 7  # VERSION_MISMATCH: another diagd version on the remote host
EXIT_NO_REMOTE_DIAGD = 127  # REMOTE_DIAGD_NOT_FOUND: what the remote shell itself says for "command not found"
EXIT_SSH_FAILED = 255  # SSH_FAILED: what ssh itself exits with for its own failures

