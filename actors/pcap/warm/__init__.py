"""Early-stopping tshark passes and the warm tsharks they run on, before a capture's sharkd answers: a
new filter's first page, first matches and first text from one tshark that stops early (first_page.py),
and tsharks started ahead of need so that such a pass skips tshark's start-up (standby.py; any field
list: fields_standby.py). It may import ngap/, masking/ and shark/ (today only shark/) and messages.py,
never engine/, answers/ nor the rest of the back end's surface; those import it (the layers contract in
pyproject.toml's [tool.importlinter]).
"""
