"""What a tool asks an actor, typed by its reply: `Message[SomeReply]` (actors/base.py has the actor side).

A module of its own, called by nothing but the `reply` crossing: the tools build messages, the actors
match them and hand their replies back through `Message.reply`, and neither path re-enters the actor
base the supervisor runs (tests/test_call_path.py)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

ReplyT = TypeVar("ReplyT")


class Message(Generic[ReplyT]):
    """A message whose reply is a `ReplyT` (a reply model, a TypedDict): the reply type travels with it.

        @dataclass(frozen=True)
        class Send(Message[SendReply]): ...

    The tool handler's `await runtime.ask(ref, Send(...))` is a `SendReply`, returned as it is (no cast),
    and the actor's `case Send() as send: return send.reply(await self._send(send))` must build one. In
    between, the inbox carries replies as plain dicts (`Request`): `reply` is that one crossing.
    """

    __slots__ = ()

    def reply(self, value: ReplyT) -> dict[str, Any]:
        """`value`, this message's reply model, as the inbox carries it (the same object)."""
        return cast("dict[str, Any]", value)  # a TypedDict is a dict at run time
