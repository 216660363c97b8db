"""Training provisioning, all of it: the performance and convergence models, their estimators, the spec and
plan types, the provisioners, the gradient block planner and the communication simulator.

- `models`: iteration-time and convergence models (homogeneous PS, heterogeneous spot), vectorised;
- `estimators`: scikit-learn style fits of their coefficients from profiling data;
- `spec`: the job spec, the instance catalog and the plan (`TrainingError` names field and fix);
- `homogeneous`, `spot`: provisioners (estimate every candidate, then optimise);
- `blocks`, `comm_sim`: gradient partitioning and the PS communication simulator;
- `kube`: Kubernetes manifests of a plan;
- `readers`: the one module that reads files (bundled data and user files).

Everything here is pure (no I/O, no clock) except `readers`; the EC2 edge is `training.cloud`.
"""
