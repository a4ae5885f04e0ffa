"""The web view at /ui on the HTTP listener: its one-time login links and browser sessions (auth.py, also
minted by the control socket for `diagd ui`), the live call feed (feed.py) and the pages and API themselves
(web.py, routed to by http/front.py). It may import the server's core modules (audit's call records,
asgi_body.py), never mcp/ or http/ (which routes to it)."""
