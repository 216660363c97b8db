"""The reconcile loop and its pure steps: slots (plan GPUs -> node devices), planning (the solve step),
diff (what changes per node) and loop (observe -> solve -> diff -> act, the applied plan)."""
