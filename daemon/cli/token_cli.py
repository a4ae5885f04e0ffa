"""`diagd token add NAME | list | revoke NAME`: works on the token file, needs no daemon (stdlib only)."""

from __future__ import annotations

import json
import sys

from diagd.daemon.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from diagd.daemon.tokens import TokenStore
from diagd.protocol.errors import DiagdError


def run(action: str, name: str | None, *, as_json: bool = False, store: TokenStore | None = None) -> int:
    store = store or TokenStore()
    if action in ("add", "revoke") and not name:
        sys.stderr.write(f"diagd token: `diagd token {action} NAME` needs a name\n")
        return EXIT_USAGE
    try:
        if action == "add":
            assert name is not None
            secret = store.add(name)
            sys.stderr.write(f"token {name!r} added; it is shown only now, keep it in the client's config:\n")
            print(secret)  # stdout: `diagd token add ci > file` captures the secret alone
        elif action == "revoke":
            assert name is not None
            store.revoke(name)
            sys.stderr.write(f"token {name!r} revoked (the running daemon refuses it from the next request)\n")
        else:
            listing(store, as_json=as_json)
    except DiagdError as exc:
        sys.stderr.write(f"diagd token: {exc.code}: {exc.message}\n")
        return EXIT_FAILED
    return EXIT_OK


def listing(store: TokenStore, *, as_json: bool) -> None:
    """Names and creation times; never a secret, nor its hash (which would confirm a guessed token)."""
    rows = [{"name": t.name, "created": t.created} for t in store.tokens()]
    if as_json:
        print(json.dumps({"tokens": rows, "file": str(store.path)}))
        return
    if not rows:
        print(f"no tokens ({store.path}); add one with `diagd token add NAME`")
        return
    width = max(4, *(len(r["name"]) for r in rows))
    print(f"{'NAME'.ljust(width)}  CREATED")
    for r in rows:
        print(f"{r['name'].ljust(width)}  {r['created']}")
