"""The masking boundary of the pcap tools (`[pcap] mask_subscriber_ids = true`): `SubscriberMask.guard`
wraps every tool's handler, so every result, error and progress message leaves masked; the
identities of each capture are collected here, once per capture and decoding (the rules: mask.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Container
from pathlib import Path
from typing import Any

import structlog
import trio

from diagd.actors._subprocess import run
from diagd.actors.pcap.masking.mask import ALL_FIELDS, MAX_CAPTURES, TEXT_FIELDS, Identities, Masker, identities_from
from diagd.actors.tooling import CallContext, Handler, Reply
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.pcap.mask")


CaptureOf = Callable[[dict[str, Any]], Awaitable[tuple[str, list[str]] | None]]


class SubscriberMask:
    """The masking boundary of the pcap tools: identities per capture, and the handler guard."""

    def __init__(self, *, enabled: Callable[[], bool], output_dir: Callable[[], Path],
                 capture_of: CaptureOf, known_fields: Callable[[], Awaitable[Container[str]]]) -> None:
        self._enabled = enabled
        self._output_dir = output_dir
        self._capture_of = capture_of  # args -> (key, tshark argv reading the capture as the tool does)
        self._known_fields = known_fields
        self._collected: OrderedDict[str, Identities] = OrderedDict()
        self._collecting: dict[str, trio.Event] = {}
        self._all = Identities()
        self._masker = Masker(self._all)

    @property
    def masker(self) -> Masker:
        return self._masker

    def guard(self, name: str, handler: Handler) -> Handler:
        async def guarded(ctx: CallContext, args: dict[str, Any]) -> Reply:
            if not self._enabled():
                return await handler(ctx, args)
            progress = ctx.progress
            if progress is not None:
                async def masked_progress(done: float, total: float | None, message: str | None) -> None:
                    await progress(done, total, self._masker.text(message) if message else message)
                ctx.progress = masked_progress
            try:
                result = await handler(ctx, args)
            except DiagdError as exc:
                await self._learn_quietly(args)
                raise self._mask_error(exc) from None
            except Exception as exc:
                # The registry would turn this into INTERNAL_ERROR with the exception's text, which
                # may quote a value: it is logged here and answered masked.
                log.exception("tool crashed", tool=name)
                await self._learn_quietly(args)
                raise DiagdError(ErrorCode.INTERNAL_ERROR,
                                 self._masker.text(f"{name} failed: {type(exc).__name__}: {exc}")) from None
            finally:
                ctx.progress = progress
            try:
                await self.learn(args)
            except DiagdError as exc:
                raise self._mask_error(exc) from None
            # A 2 MB frame dump takes about half a second to mask: off the event loop, so other
            # calls are not held up (a Masker is never changed once built, so this is thread-safe).
            masked: dict[str, Any] = await trio.to_thread.run_sync(self._masker.value, result)
            # The file is found by its real name: a capture named after an IMSI gives an export
            # whose reported name is masked too.
            return await self._mask_files(result.get("output_path"), masked)

        return guarded

    def _mask_error(self, exc: DiagdError) -> DiagdError:
        masked = DiagdError(exc.code, self._masker.text(exc.message), **self._masker.value(exc.details))
        return masked

    async def _learn_quietly(self, args: dict[str, Any]) -> None:
        """Collect what can be collected before masking an error (a bad path has no identities)."""
        try:
            await self.learn(args)
        except DiagdError:
            pass

    async def learn(self, args: dict[str, Any]) -> None:
        """Make sure the identities of the capture `args` names are known (one tshark pass each)."""
        capture = await self._capture_of(args)
        if capture is None:
            return
        key, argv = capture
        while key not in self._collected:
            if key in self._collecting:  # another call collects this capture: share its pass
                await self._collecting[key].wait()
                continue
            self._collecting[key] = done = trio.Event()
            try:
                ids = await self._collect(argv)
                self._collected[key] = ids
                if len(self._collected) > MAX_CAPTURES:
                    self._collected.popitem(last=False)
                self._all = self._all | ids  # identities of every capture seen mask every result
                self._masker = Masker(self._all)
            finally:
                del self._collecting[key]
                done.set()
        self._collected.move_to_end(key)

    async def _collect(self, argv: list[str]) -> Identities:
        known = await self._known_fields()
        fields = [f for f in ALL_FIELDS if f in known]
        if not fields:
            return Identities()
        command = [*argv, "-o", "nas-5gs.null_decipher:TRUE", "-Y", " || ".join(fields), "-T", "fields",
                   "-E", "occurrence=a", "-E", "aggregator=,", "-E", "separator=/t"]
        for f in fields:
            command += ["-e", f]
        try:
            done = await run(command)
        except DiagdError as exc:
            if exc.code is not ErrorCode.BACKEND_UNAVAILABLE:
                raise
            raise DiagdError(ErrorCode.TSHARK_NOT_FOUND, f"tshark cannot run to list subscriber identities: "
                             f"{exc.message}", hint="mask_subscriber_ids = true needs tshark; results are withheld"
                             ) from None
        stderr = done.stderr
        if done.returncode != 0 and not ("cut short" in stderr and done.stdout):
            # Fail closed: without the identity list a result could show digits the patterns miss.
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                             "could not list the subscriber identities in the capture, so the result is "
                             "withheld (mask_subscriber_ids = true)",
                             stderr=stderr.strip()[-1000:])
        values: dict[str, list[str]] = {f: [] for f in fields}
        for line in done.out.splitlines():
            for f, cell in zip(fields, line.split("\t"), strict=False):
                if cell:
                    values[f].extend(cell.split(",") if f not in TEXT_FIELDS else [cell])
        return identities_from(values)

    async def _mask_files(self, path_text: Any, result: dict[str, Any]) -> dict[str, Any]:
        """Text files a tool wrote (packet-list TSV) are masked in place; binary captures cannot be."""
        if not isinstance(path_text, str):
            return result
        path = Path(path_text)
        output_dir = self._output_dir()
        masker = self._masker

        def rewrite() -> int | None:
            """Mask a text export in place (None: not a text file this tool wrote)."""
            try:
                if not path.resolve().is_relative_to(output_dir.resolve()):
                    return None  # only files in the output dir are ours to rewrite
            except OSError:
                return None
            if path.suffix not in (".tsv", ".txt", ".csv", ".json"):
                return -1
            lines = path.read_text(encoding="utf-8").split("\n")
            # A TSV header names the columns: a column named after an identity field is masked like
            # the same key in the returned preview rows.
            header = lines[0].split("\t") if path.suffix == ".tsv" else []
            out = [masker.text(lines[0])]
            for line in lines[1:]:
                cells = line.split("\t") if header else [line]
                out.append("\t".join(str(masker.value(cell, header[i] if i < len(header) else None))
                                      for i, cell in enumerate(cells)))
            path.write_text("\n".join(out), encoding="utf-8")
            return path.stat().st_size

        size = await trio.to_thread.run_sync(rewrite)
        if size is None:
            return result
        if size >= 0:
            if "file_size_bytes" in result:
                result["file_size_bytes"] = size
            return result
        warning = ("the written file holds the original packets: subscriber identities in it are not masked "
                   "(mask_subscriber_ids masks what the tools return)")
        warnings = result.get("warnings")
        result["warnings"] = [*warnings, warning] if isinstance(warnings, list) else [warning]
        return result
