"""Discrete-event simulator of a plan (see simulate docstring)."""
