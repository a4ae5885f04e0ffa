"""The systemd units, shipped as package data so `diagd service install` finds them after any install."""
