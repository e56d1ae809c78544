"""Replaying traces on real resources, calibrating a machine, and holding the simulator to both."""
