"""The capture engine, a loaded capture's sharkd workers, filter passes and caches: what a capture is as
a worker loads it (capture.py), its worker pool (pool.py), the filter passes and pages over it
(passes.py), its byte-bounded caches (cache.py), the session the actor owns that joins them (session.py),
and which captures stay loaded (captures.py). It may import warm/, ngap/, masking/ and shark/ (today
warm/ and shark/) and messages.py, never answers/ nor the rest of the back end's surface; those import it
(the layers contract in pyproject.toml's [tool.importlinter]).
"""
