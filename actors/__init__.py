"""Actor kinds: one module per resource kind, each registering its tools with the daemon."""

# Back-end modules loaded by every daemon, in this order.
BACKENDS: tuple[str, ...] = ("diagd.actors.pcap", "diagd.actors.serial", "diagd.actors.bpftrace", "diagd.actors.crash")
