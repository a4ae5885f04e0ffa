"""The drgn worker: `python -m diagd.actors.crash.drgn_worker`, one per crash session.

drgn runs arbitrary Python (the agent's) against a loaded kernel image, so it never runs inside the
daemon: this process holds `prog` and a persistent namespace with drgn's Linux helpers imported,
and speaks the length-prefixed msgpack protocol of `proto` on its stdin/stdout.

- The protocol owns duplicates of fds 0 and 1; fd 0 becomes /dev/null and fd 1 points at stderr,
  so neither user code nor libdrgn can read or corrupt a frame. `print()` output of user code goes
  straight to the output file the request names (cut at its cap); the reply carries only its first
  bytes and counts, so no output, however big, can break a frame or fill this process's memory.
- An exception in user code comes back as text; the worker and its namespace carry on.
- SIGINT interrupts running user code (the daemon's timeout) and is ignored otherwise.
- It exits on stdin EOF, on `quit`, and, checked every second, when its parent (the daemon) is gone.
"""

from __future__ import annotations

import ast
import io
import os
import signal
import sys
import threading
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from types import FrameType
from typing import Any, BinaryIO

from diagd.actors.crash import proto as proto
from diagd.actors.crash.output import OutputWriter
from diagd.actors.system import rss_bytes
from diagd.protocol.errors import DiagdError, ErrorCode


class _Capture(io.TextIOBase):
    """stdout/stderr of user code: a write-only text stream into the output file (UTF-8)."""

    def __init__(self, writer: OutputWriter) -> None:
        self.writer = writer

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not self.writer.truncated:
            self.writer.write(text.encode("utf-8", errors="backslashreplace"))
        return len(text)


class _OutputFrames(io.RawIOBase):
    """The output file of one Exec as it goes back: Output frames of at most FRAME_DATA bytes."""

    FRAME_DATA = 1 << 20

    def __init__(self, worker: Worker, request_id: int) -> None:
        self.worker = worker
        self.request_id = request_id
        self._pending = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: Any, /) -> int:
        self._pending += bytes(data)
        while len(self._pending) >= self.FRAME_DATA:
            self._send(self.FRAME_DATA)
        return len(data)

    def _send(self, size: int) -> None:
        chunk, self._pending = bytes(self._pending[:size]), self._pending[size:]
        self.worker.send(proto.Output(id=self.request_id, data=chunk))

    def flush(self) -> None:
        if self._pending and not self.closed:
            self._send(len(self._pending))

    def close(self) -> None:
        if not self.closed:
            self.flush()
        super().close()


class Worker:
    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.prog: Any = None
        self.namespace: dict[str, Any] = {"__name__": "__drgn__"}
        self.initial: dict[str, Any] = dict(self.namespace)
        self.in_exec = False

    def send(self, msg: proto.Message) -> None:
        self.out.write(proto.encode(msg))
        self.out.flush()

    # -- requests -------------------------------------------------------------------------------

    def handle(self, msg: proto.Message) -> bool:
        """Serve one request; False means stop."""
        if isinstance(msg, proto.Load):
            self.send(self.load(msg))
        elif isinstance(msg, proto.Exec):
            self.send(self.execute(msg))
        elif isinstance(msg, proto.Ping):
            self.send(proto.Pong(id=msg.id, rss_bytes=rss_bytes() or 0))
        elif isinstance(msg, proto.Quit):
            self.send(proto.Pong(id=msg.id, rss_bytes=rss_bytes() or 0))
            return False
        else:
            self.send(proto.Error(id=getattr(msg, "id", -1), code=str(ErrorCode.PROTOCOL_ERROR),
                                  message=f"the worker does not take {msg.tag!r} messages"))
        return True

    def load(self, msg: proto.Load) -> proto.Message:
        if msg.version != proto.PROTOCOL_VERSION:
            return proto.Error(id=msg.id, code=str(ErrorCode.PROTOCOL_ERROR),
                               message=f"protocol version {msg.version} != worker's {proto.PROTOCOL_VERSION}")
        started = time.monotonic()
        try:
            import drgn

            prog = drgn.Program()
            prog.set_core_dump(msg.vmcore)
        except Exception as exc:
            return proto.Error(id=msg.id, code=str(ErrorCode.INVALID_ARGUMENT),
                               message=f"drgn cannot open {msg.vmcore}: {type(exc).__name__}: {exc}")
        warnings: list[str] = []
        try:
            prog.load_debug_info(msg.debug_files)
        except drgn.MissingDebugInfoError as exc:
            warnings.append(str(exc))
        except Exception as exc:
            return proto.Error(id=msg.id, code=str(ErrorCode.INVALID_ARGUMENT),
                               message=f"drgn cannot load debug info: {type(exc).__name__}: {exc}")
        self.prog = prog
        drgn.set_default_prog(prog)
        exec("from drgn import *\nfrom drgn.helpers.common import *\nfrom drgn.helpers.linux import *",
             self.namespace)
        self.namespace.update(prog=prog, drgn=drgn)
        self.initial = dict(self.namespace)
        tasks, pid, comm = -1, -1, ""
        try:
            from drgn.helpers.linux.pid import for_each_task

            tasks = sum(1 for _ in for_each_task(prog))
            thread = prog.crashed_thread()
            pid, comm = int(thread.tid), thread.object.comm.string_().decode(errors="replace")
        except Exception as exc:
            warnings.append(f"drgn could not walk the tasks: {type(exc).__name__}: {exc}")
        return proto.Loaded(id=msg.id, load_s=time.monotonic() - started, warnings=warnings, tasks=tasks,
                            crashed_pid=pid, crashed_comm=comm)

    def execute(self, msg: proto.Exec) -> proto.Message:
        writer = OutputWriter(None, msg.max_output_bytes, stream=_OutputFrames(self, msg.id))
        try:
            return self._execute(msg, writer)
        finally:
            writer.close()

    def _execute(self, msg: proto.Exec, writer: OutputWriter) -> proto.ExecResult:
        started = time.monotonic()
        capture = _Capture(writer)
        error: str | None = None
        interrupted = False
        try:
            tree = ast.parse(msg.code, msg.filename, "exec")
            last: ast.Expression | None = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body[-1].value)
                del tree.body[-1]
            body = compile(tree, msg.filename, "exec")
            tail = compile(last, msg.filename, "eval") if last is not None else None
            namespace = {**self.initial, "__name__": "__main__"} if msg.isolated else self.namespace
            with redirect_stdout(capture), redirect_stderr(capture):
                self.in_exec = True
                try:
                    exec(body, namespace)
                    if tail is not None:
                        value = eval(tail, namespace)
                        if value is not None:
                            namespace["_"] = value
                            print(display(value))
                finally:
                    self.in_exec = False
        except KeyboardInterrupt:
            interrupted = True
            error = f"KeyboardInterrupt: interrupted after {time.monotonic() - started:.1f} s"
        except BaseException as exc:  # SystemExit too: user code must not end the worker
            error = format_user_exception(exc)
        if error is not None:
            error = _abridge(error, proto.MAX_ERROR_CHARS)
            # The stored output ends with the traceback, like the drgn shell shows it (even past the cap).
            newline = b"" if writer.size == 0 or writer.ends_with_newline else b"\n"
            writer.append_unlimited(newline + error.encode("utf-8", errors="backslashreplace") + b"\n")
        return proto.ExecResult(id=msg.id, head=writer.head, head_complete=writer.size <= writer.head_bytes,
                                output_bytes=writer.size, lines=writer.lines, error=error,
                                duration_s=time.monotonic() - started, truncated=writer.truncated,
                                interrupted=interrupted)


def _abridge(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n{text[-half:]}"


def display(value: Any) -> str:
    """What the drgn CLI shows for an expression: drgn's own formatting for its objects."""
    try:
        import drgn

        if isinstance(value, drgn.Object):
            return str(value.format_())
        if isinstance(value, drgn.StackTrace | drgn.Type | drgn.Symbol):
            return str(value)
    except Exception:
        pass
    return repr(value)


def format_user_exception(exc: BaseException) -> str:
    """The traceback without the worker's own frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(3)  # the daemon died without closing us: do not linger with 300 MB


def _no_exec() -> None:
    """Forbid execve from now on, on every kernel: a seccomp filter (and, inside a Landlock sandbox, as
    the launcher says in DIAGD_SANDBOX, a Landlock layer too). The launcher had to execute Python to
    start this worker; the user's code needs no program."""
    import json

    from diagd.actors.sandbox.kernel import deny_exec

    try:
        landlock = bool(json.loads(os.environ.get("DIAGD_SANDBOX", "{}")).get("landlock", 0))
    except (ValueError, AttributeError):
        landlock = False
    deny_exec(landlock=landlock)


def main() -> int:
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = Worker(proto_out)

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        if worker.in_exec:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    try:
        import drgn

        drgn_version = str(drgn.__version__)
    except Exception as exc:  # reported on the first load
        drgn_version = f"unavailable: {exc}"
    _no_exec()
    worker.send(proto.Hello(version=proto.PROTOCOL_VERSION, pid=os.getpid(), drgn_version=drgn_version))
    while True:
        try:
            body = proto.read_frame(proto_in)
        except DiagdError as exc:
            worker.send(proto.Error(id=-1, code=str(exc.code), message=exc.message))
            return 2  # the stream is out of step: nothing after this can be trusted
        if body is None:
            return 0
        try:
            msg = proto.decode(body)
        except DiagdError as exc:
            worker.send(proto.Error(id=-1, code=str(exc.code), message=exc.message))
            continue
        try:
            if not worker.handle(msg):
                return 0
        except DiagdError as exc:  # e.g. a reply that cannot be encoded: answer, never die with a traceback
            worker.send(proto.Error(id=getattr(msg, "id", -1), code=str(exc.code), message=exc.message))


if __name__ == "__main__":
    sys.exit(main())
