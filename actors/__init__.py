"""The back ends: one package each, registering its tools with the daemon; shared plumbing at the top."""

# Back-end modules loaded by every daemon, in this order.
BACKENDS: tuple[str, ...] = ("diagd.actors.pcap", "diagd.actors.serial", "diagd.actors.bpftrace", "diagd.actors.crash",
                             "diagd.actors.capture")
