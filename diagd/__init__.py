"""diagd: a diagnostics daemon for AI agents (pcap, serial, bpftrace, kernel crash dumps)."""

__version__ = "0.1.0"
