"""The NGAP views of one indexed capture (UE contexts, their procedures, PDU sessions), for its IndexActor:
one model per decoding read from the capture's index (ngap_pdus.py) and rendered by the same view
functions as the loaded capture's; the procedures view with the PFCP and SBI rows read from a cut too
(core_rows.py). What was read or rendered is kept, a few of each, and the whole capture's views on
disk beside the index, so a restarted daemon's first answer reads a file.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import trio

from diagd.actors.pcap import ngap
from diagd.actors.pcap.index import core_rows, filters, ngap_pdus, query
from diagd.actors.pcap.index.ngap_pdus import Decoding
from diagd.actors.pcap.index.readings import Readings
from diagd.actors.pcap.index.store import Stored
from diagd.protocol.errors import DiagdError, ErrorCode

MODELS_KEPT = 2  # NGAP models (one per decoding: with and without NAS after NEA0)
FILTERED_MODELS_KEPT = 4  # NGAP models of filtered frames
VIEWS_KEPT = 8  # rendered NGAP views (UE contexts, PDU sessions) of those models
CORE_ROWS_KEPT = 1  # the PFCP and SBI rows of the capture's index (~1 KB a row)

Render = Callable[[ngap.Model], Awaitable[Mapping[str, Any]]]


class NgapViews:
    """The NGAP views of one capture's index; `on_disk` gives the ready index or raises a coded error,
    `touch` marks it used (the store's LRU), readings run in the nursery given to `start`, one at a time
    daemon-wide with the other cuts (`cuts`)."""

    def __init__(self, capture: Path, tshark_argv: list[str], on_disk: Callable[[], Stored],
                 touch: Callable[[Path], None], cuts: trio.CapacityLimiter | None = None) -> None:
        self.capture = capture
        self.tshark_argv = tshark_argv  # the capture's own two-pass tshark command (the PFCP and SBI rows)
        self._on_disk = on_disk
        self._touch = touch
        self._nursery: trio.Nursery | None = None
        # NGAP models per (index, decoding), the PFCP and SBI rows per index: read once (readings.py).
        self._models: Readings[tuple[Path, str], ngap.Model] = Readings(
            "the NGAP model", MODELS_KEPT, permanent=(ngap_pdus.Unanswered,), limiter=cuts)
        self._core: Readings[Path, list[dict[str, str]]] = Readings("the PFCP and SBI rows", CORE_ROWS_KEPT,
                                                                     limiter=cuts)
        self._filtered: dict[tuple[Path, str, str], ngap.Model] = {}  # (index, decoding, filter): a few
        self._views: dict[tuple[Path, str, str, str], dict[str, Any]] = {}  # ... and view: their answers

    def start(self, nursery: trio.Nursery) -> None:
        self._models.start(nursery)
        self._core.start(nursery)

    @property
    def reading(self) -> bool:
        return self._models.busy or self._core.busy

    def unanswered(self, stored: Stored | None, decoding: Decoding) -> str | None:
        """Why this capture's NGAP model does not come from its index (known after a first try), or None."""
        if stored is None:
            return "the index is not ready"
        failed = self._models.failure((stored.path, decoding.digest()))
        return failed.message if failed is not None else None

    async def ue_sessions(self, decoding: Decoding, display_filter: str) -> dict[str, Any]:
        async def render(model: ngap.Model) -> Mapping[str, Any]:
            return ngap.ue_sessions(model, filtered=bool(display_filter))
        return await self._view(decoding, display_filter, "ue_sessions", render)

    async def pdu_sessions(self, decoding: Decoding, display_filter: str) -> dict[str, Any]:
        async def render(model: ngap.Model) -> Mapping[str, Any]:
            return ngap.pdu_sessions(model, filtered=bool(display_filter))
        return await self._view(decoding, display_filter, "pdu_sessions", render)

    async def procedures(self, decoding: Decoding, display_filter: str) -> dict[str, Any]:
        """The procedures view: the whole capture's PFCP and SBI rows (as the loaded capture's, of every
        frame whatever the filter) linked to the PDU session establishments of the model."""
        async def render(model: ngap.Model) -> Mapping[str, Any]:
            rows = await self._core_rows() if model.pdus else []
            return ngap.procedures(model, filtered=bool(display_filter), core_rows=rows)
        return await self._view(decoding, display_filter, "procedures", render)

    async def _core_rows(self) -> list[dict[str, str]]:
        try:
            stored = self._on_disk()
        except DiagdError as exc:  # gone since the model was read: the loaded capture answers
            raise DiagdError(exc.code, exc.message, **exc.details, index_unanswered=True) from None

        async def read() -> list[dict[str, str]]:
            return await core_rows.core_rows(self.capture, stored.path, int(stored.meta.get("frames", 0)),
                                             self.tshark_argv)
        return await self._core.get(stored.path, read)

    async def _view(self, decoding: Decoding, display_filter: str, view: str, render: Render) -> dict[str, Any]:
        """One view of the NGAP model (`render`), kept: the last few in memory, the whole capture's on disk
        beside the index too (ngap_pdus.store_view), so a restarted daemon's first answer reads a file
        instead of the PDUs (a second for 25,000 of them) and the model built from them (another)."""
        try:
            stored = self._on_disk()
        except DiagdError as exc:  # gone or not ready since the tool looked: the loaded capture answers
            raise DiagdError(exc.code, exc.message, **exc.details, index_unanswered=True) from None
        key = (stored.path, decoding.digest(), display_filter, view)
        answer = self._views.pop(key, None)
        if answer is None and not display_filter:
            answer = await trio.to_thread.run_sync(ngap_pdus.stored_view, stored.path, decoding, view)
        if answer is None:
            rendered = dict(await render(await self._model(decoding, display_filter)))
            answer = rendered
            if not display_filter:
                await trio.to_thread.run_sync(ngap_pdus.store_view, stored.path, decoding, view, rendered)
        self._views[key] = answer
        while len(self._views) > VIEWS_KEPT:
            self._views.pop(next(iter(self._views)))
        self._touch(stored.path)
        return answer

    async def _model(self, decoding: Decoding, display_filter: str) -> ngap.Model:
        """The NGAP model of the frames meeting a filter the index translates (filters.py), as the loaded
        capture builds it (answers.ngap_model): of the whole capture's PDUs, those of the matching frames."""
        whole = await self._whole_model(decoding)
        if not display_filter:
            return whole
        where = filters.to_sql(display_filter)
        if where is None:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "the index does not answer this filter (sharkd does)")
        stored = self._on_disk()
        key = (stored.path, decoding.digest(), display_filter)
        model = self._filtered.pop(key, None)
        if model is None:
            wanted = await trio.to_thread.run_sync(query.meeting, stored.path, where,
                                                   sorted({p.frame for p in whole.pdus}))
            model = await trio.to_thread.run_sync(ngap.build_model, [p for p in whole.pdus if p.frame in wanted])
        self._filtered[key] = model
        while len(self._filtered) > FILTERED_MODELS_KEPT:
            self._filtered.pop(next(iter(self._filtered)))
        return model

    async def _whole_model(self, decoding: Decoding) -> ngap.Model:
        """The one NGAP model of the whole capture (index/ngap_pdus.py), read once per decoding in the
        actor's nursery: a call that times out meanwhile leaves it going for the next. Where the index
        cannot give it, NOT_FOUND with `index_unanswered` (the tool then asks the loaded capture)."""
        stored = self._on_disk()

        async def read() -> ngap.Model:
            try:
                found = await ngap_pdus.pdus(self.capture, stored.path, int(stored.meta.get("frames", 0)), decoding)
            except DiagdError as exc:  # sharkd missing or failing, the index gone: tried again later
                raise DiagdError(ErrorCode.NOT_FOUND, f"the NGAP model is not read from the index: {exc.message}",
                                 index_unanswered=True) from None
            return await trio.to_thread.run_sync(ngap.build_model, found)
        model = await self._models.get((stored.path, decoding.digest()), read)
        self._touch(stored.path)
        return model
