"""Subscriber-identity masking of the pcap tools' results (`[pcap] mask_subscriber_ids = true`): the
rules and the identities of each capture (mask.py), and the boundary that wraps every tool's handler so
that every result, error and progress message leaves masked (guard.py). It may import shark/ and
messages.py (today only shark/'s tree.py), never ngap/ (its independent sibling), warm/, engine/, answers/
nor the rest of the back end's surface; the tools import it (the layers contract in pyproject.toml's
[tool.importlinter]).
"""
