"""Training provisioning: pure provisioners, gradient block planner, comm simulator.

Everything here is pure (no I/O, no clock) except `files`, the one small
module that reads the bundled data and user files.
"""
