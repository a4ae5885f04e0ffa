"""The MCP front end over the Unix socket: the newline-delimited JSON-RPC lines `diagd mcp`'s stdio shim
carries, screened (wire.py) and read within the byte budget (lines.py), then served by the SDK's low-level
`Server` (front.py) with the daemon's request checks, validation answers and resources (requests.py,
validation.py, resources.py). front.py, and the SDK with it, loads when the first MCP client connects
(server.LazyFront, after sdk.py's `lean()`), never at start-up; sdk.py itself is light. It may import the
server's core modules (connections, eras, tools, tool_listing), diagd.daemon's top level and the MCP SDK,
but neither http/ nor ui/: HTTP builds on this package, not the reverse."""
