"""The back ends: one package each, registering its tools with the daemon; shared plumbing at the top.

The daemon finds the back ends through their `diagd.backends` entry points (pyproject.toml,
daemon/discovery.py); nothing here lists them.
"""
