"""Planning, pure: the solvers (`planner.solver`), the plan replay (`planner.simulate`) and workload files."""
