"""MCP over Streamable HTTP (`[http] listen`): the hypercorn front end and its bearer-token check (front.py,
auth.py), the same request screening as the socket (wire.py), the answers to requests in flight when the
daemon stops (inflight.py), and the sessions, bounded and carried across restarts (sessions.py,
session_book.py, session_file.py, session_replay.py). start.py is server.py's door: it imports front.py,
and hypercorn with it, only when HTTP is on. It may import the server's core modules, mcp/ (the screening
and the SDK server it shares with the socket) and ui/ (the web view it routes /ui to)."""
