"""Who is connected, as back ends see clients: `Clients`, and the hooks told when one comes or goes."""

from __future__ import annotations

import structlog

from diagd.actors.runtime import Client, ClientHook

log = structlog.get_logger("diagd.backends")


class Clients:
    """Who is connected, as back ends see clients, and the hooks told when one comes or goes.

    MCP clients count from their connection's first message to its end; a `diagd call` command
    from its hello to its end. A client may hold several connections: it is gone with the last.
    """

    def __init__(self) -> None:
        self._connected: dict[str, tuple[Client, int]] = {}
        self.connected_hooks: list[ClientHook] = []
        self.gone_hooks: list[ClientHook] = []

    def now(self) -> list[Client]:
        return [client for client, _ in self._connected.values()]

    def connected(self, client: Client) -> None:
        _, count = self._connected.get(client.name, (client, 0))
        self._connected[client.name] = (client, count + 1)
        if count == 0:
            self._tell(self.connected_hooks, client)

    def gone(self, client: Client) -> None:
        _, count = self._connected.get(client.name, (client, 1))
        if count > 1:
            self._connected[client.name] = (client, count - 1)
            return
        self._connected.pop(client.name, None)
        self._tell(self.gone_hooks, client)

    @staticmethod
    def _tell(hooks: list[ClientHook], client: Client) -> None:
        for hook in hooks:
            try:
                hook(client)
            except Exception:  # one back end's bug must not keep the others holding the client's resources
                log.exception("client hook failed", client=client.name)
